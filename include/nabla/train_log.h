// Training logs: a CSV file with one row per logged step, and an SVG chart of
// the loss and accuracy curves that any browser shows without scripts or
// external files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace nabla {

// One logged step. A NaN field is "not measured at this step" (validation
// usually runs less often than logging) and is an empty CSV cell.
struct TrainRow {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  int64_t step = 0;
  double epoch = kNone;
  double train_loss = kNone;
  double train_acc = kNone;  // fraction in [0, 1]
  double val_loss = kNone;
  double val_acc = kNone;
  double throughput = kNone;  // images/s or tokens/s, named by CsvLog's column
  double lr = kNone;
  double elapsed_s = kNone;  // wall time since training started
};

// Appends rows to a CSV file:
//   step,epoch,train_loss,train_acc,val_loss,val_acc,images_per_s,lr,elapsed_s
// Each row is flushed as it is written, so a crash or a `tail -f` sees every
// finished step. Numbers keep 7 significant digits.
class CsvLog {
 public:
  enum class Mode {
    truncate,  // start a new file
    append,    // resume: keep the rows of a file with the same header
  };
  // `throughput_column` names the throughput column, e.g. "images_per_s"
  // or "tokens_per_s". In append mode a file whose header differs is an
  // IoError (it is some other log).
  explicit CsvLog(std::string path, std::string throughput_column = "images_per_s",
                  Mode mode = Mode::truncate);
  ~CsvLog();
  CsvLog(const CsvLog&) = delete;
  CsvLog& operator=(const CsvLog&) = delete;

  void append(const TrainRow& row);  // IoError when the write fails
  const std::string& path() const { return path_; }
  std::string header() const;  // without the newline

 private:
  std::string path_, throughput_column_;
  std::FILE* file_ = nullptr;
};

// Reads back a file written by CsvLog (any throughput column name); empty
// cells are NaN. IoError naming the file and line on a malformed row.
std::vector<TrainRow> read_csv_log(const std::string& path);

// ---- SVG line charts

struct PlotCurve {
  std::string label;                          // legend text
  std::vector<std::pair<double, double>> xy;  // points in x order; non-finite y are skipped
};

struct PlotPanel {
  std::string title, x_label, y_label;
  std::vector<PlotCurve> curves;
};

// The two panels of a training run: loss (train, val) and accuracy (train,
// val), each against step.
std::vector<PlotPanel> training_panels(const std::vector<TrainRow>& rows);

// Writes panels side by side as one self-contained SVG file: axes with ticks
// and labels, a light grid, one polyline per curve, a legend per panel.
// Written atomically (write_file_atomic).
void write_svg_plot(const std::string& path, const std::vector<PlotPanel>& panels,
                    const std::string& title = "");

// Same as write_svg_plot(path, training_panels(rows), title).
void write_svg_plot(const std::string& path, const std::vector<TrainRow>& rows,
                    const std::string& title = "");

}  // namespace nabla
