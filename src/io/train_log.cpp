// CSV training log and SVG line charts (include/nabla/train_log.h).
#include "nabla/train_log.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "nabla/error.h"
#include "nabla/io.h"

namespace nabla {

namespace {

constexpr int kColumns = 9;
constexpr int kThroughputColumn = 6;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Empty for "not measured"; 7 significant digits keep f32 losses readable.
std::string cell(double v) { return std::isnan(v) ? std::string() : fmt("%.7g", v); }

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out(1);
  for (char c : line) {
    if (c == sep)
      out.emplace_back();
    else
      out.back().push_back(c);
  }
  return out;
}

bool read_line(std::istream& in, std::string& line) {
  if (!std::getline(in, line)) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

// ---- SVG

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      // Control characters other than tab and newlines are not allowed in XML.
      default:
        out.push_back((unsigned char)c < 0x20 && c != '\t' && c != '\n' && c != '\r' ? '?' : c);
    }
  }
  return out;
}

// 1, 2 or 5 times a power of ten, near `raw`: tick steps people read easily.
double nice_step(double raw) {
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / p;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

struct Axis {
  double lo, hi, step;
};

// A range covering [min, max] that starts and ends on a tick, with ~5 ticks.
Axis nice_axis(double min, double max) {
  if (!(max > min)) {  // one value (or none): open a window around it
    double pad = std::max(std::abs(min) * 0.1, 0.5);
    min -= pad;
    max += pad;
  }
  double step = nice_step((max - min) / 5);
  return {std::floor(min / step) * step, std::ceil(max / step) * step, step};
}

std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) v = 0;  // no "-0" or 1e-17 from rounding
  if (std::abs(v) >= 1e6 || (v != 0 && std::abs(v) < 1e-4)) return fmt("%g", v);
  int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// Panel geometry, in SVG user units.
constexpr double kPanelW = 480, kPanelH = 340;
constexpr double kLeft = 64, kRight = 20, kTop = 34, kBottom = 50;
constexpr double kTitleH = 30;
const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};

void svg_panel(std::string& out, const PlotPanel& panel, double ox, double oy) {
  const double pw = kPanelW - kLeft - kRight, ph = kPanelH - kTop - kBottom;
  out += "<g class=\"panel\" transform=\"translate(" + fmt("%.0f", ox) + "," + fmt("%.0f", oy) +
         ")\">\n";
  out += "<text class=\"panel-title\" x=\"" + fmt("%.1f", kLeft + pw / 2) +
         "\" y=\"22\" text-anchor=\"middle\" "
         "font-size=\"14\" font-weight=\"bold\">" +
         escape_xml(panel.title) + "</text>\n";

  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const PlotCurve& c : panel.curves) {
    for (auto [x, y] : c.xy) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  }
  bool empty = !(xmin <= xmax);
  if (empty) xmin = xmax = ymin = ymax = 0;
  Axis ax = nice_axis(xmin, xmax), ay = nice_axis(ymin, ymax);
  auto px = [&](double x) { return kLeft + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto py = [&](double y) { return kTop + ph - (y - ay.lo) / (ay.hi - ay.lo) * ph; };

  // Grid and tick labels. Ticks are counted, not accumulated, so rounding
  // cannot add or drop the last one.
  out += "<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n";
  int nx = int(std::lround((ax.hi - ax.lo) / ax.step)),
      ny = int(std::lround((ay.hi - ay.lo) / ay.step));
  for (int i = 0; i <= nx; ++i) {
    double x = px(ax.lo + i * ax.step);
    out += "<line x1=\"" + fmt("%.2f", x) + "\" y1=\"" + fmt("%.2f", kTop) + "\" x2=\"" +
           fmt("%.2f", x) + "\" y2=\"" + fmt("%.2f", kTop + ph) + "\"/>\n";
  }
  for (int i = 0; i <= ny; ++i) {
    double y = py(ay.lo + i * ay.step);
    out += "<line x1=\"" + fmt("%.2f", kLeft) + "\" y1=\"" + fmt("%.2f", y) + "\" x2=\"" +
           fmt("%.2f", kLeft + pw) + "\" y2=\"" + fmt("%.2f", y) + "\"/>\n";
  }
  out += "</g>\n<g class=\"ticks\" font-size=\"11\" fill=\"#333\">\n";
  for (int i = 0; i <= nx; ++i) {
    double v = ax.lo + i * ax.step, x = px(v);
    out += "<line x1=\"" + fmt("%.2f", x) + "\" y1=\"" + fmt("%.2f", kTop + ph) + "\" x2=\"" +
           fmt("%.2f", x) + "\" y2=\"" + fmt("%.2f", kTop + ph + 5) + "\" stroke=\"#333\"/>\n";
    out += "<text x=\"" + fmt("%.2f", x) + "\" y=\"" + fmt("%.2f", kTop + ph + 18) +
           "\" text-anchor=\"middle\">" + tick_label(v, ax.step) + "</text>\n";
  }
  for (int i = 0; i <= ny; ++i) {
    double v = ay.lo + i * ay.step, y = py(v);
    out += "<line x1=\"" + fmt("%.2f", kLeft - 5) + "\" y1=\"" + fmt("%.2f", y) + "\" x2=\"" +
           fmt("%.2f", kLeft) + "\" y2=\"" + fmt("%.2f", y) + "\" stroke=\"#333\"/>\n";
    out += "<text x=\"" + fmt("%.2f", kLeft - 8) + "\" y=\"" + fmt("%.2f", y + 4) +
           "\" text-anchor=\"end\">" + tick_label(v, ay.step) + "</text>\n";
  }
  out += "</g>\n";

  // Frame and axis labels.
  out += "<rect class=\"frame\" x=\"" + fmt("%.2f", kLeft) + "\" y=\"" + fmt("%.2f", kTop) +
         "\" width=\"" + fmt("%.2f", pw) + "\" height=\"" + fmt("%.2f", ph) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
  out += "<text class=\"x-label\" x=\"" + fmt("%.2f", kLeft + pw / 2) + "\" y=\"" +
         fmt("%.2f", kPanelH - 12) + "\" text-anchor=\"middle\">" + escape_xml(panel.x_label) +
         "</text>\n";
  out += "<text class=\"y-label\" transform=\"translate(16," + fmt("%.2f", kTop + ph / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + escape_xml(panel.y_label) + "</text>\n";
  if (empty) {
    out += "<text x=\"" + fmt("%.2f", kLeft + pw / 2) + "\" y=\"" + fmt("%.2f", kTop + ph / 2) +
           "\" text-anchor=\"middle\" fill=\"#999\">no data</text>\n</g>\n";
    return;
  }

  // Curves. Sparse curves (validation, run every few hundred steps) also get
  // a dot per point so that a single point still shows.
  for (size_t i = 0; i < panel.curves.size(); ++i) {
    const PlotCurve& c = panel.curves[i];
    const char* color = kColors[i % std::size(kColors)];
    std::string points;
    int n = 0;
    for (auto [x, y] : c.xy) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (n++) points += ' ';
      points += fmt("%.2f", px(x)) + "," + fmt("%.2f", py(y));
    }
    if (n == 0) continue;
    out += "<polyline class=\"curve\" data-label=\"" + escape_xml(c.label) +
           "\" fill=\"none\" stroke=\"" + color +
           "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"" + points + "\"/>\n";
    if (n <= 40) {
      out += "<g fill=\"" + std::string(color) + "\">";
      for (auto [x, y] : c.xy) {
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        out += "<circle cx=\"" + fmt("%.2f", px(x)) + "\" cy=\"" + fmt("%.2f", py(y)) +
               "\" r=\"2.5\"/>";
      }
      out += "</g>\n";
    }
  }

  // Legend on a white box, in the inside corner that hides the fewest points
  // (top right unless the curves run there, as accuracy curves do).
  size_t longest = 0;
  for (const PlotCurve& c : panel.curves) longest = std::max(longest, c.label.size());
  double lw = 34 + 7.0 * double(longest), lh = 8 + 16.0 * double(panel.curves.size());
  double lx = 0, ly = 0;
  size_t fewest = SIZE_MAX;
  for (auto [cx, cy] : {std::pair{kLeft + pw - lw - 8, kTop + 8},
                        std::pair{kLeft + pw - lw - 8, kTop + ph - lh - 8},
                        std::pair{kLeft + 8, kTop + 8}, std::pair{kLeft + 8, kTop + ph - lh - 8}}) {
    size_t hidden = 0;
    for (const PlotCurve& c : panel.curves) {
      for (auto [x, y] : c.xy) {
        double X = px(x), Y = py(y);
        // Margins of 6 units keep lines that pass just outside the box clear of it.
        hidden += X >= cx - 6 && X <= cx + lw + 6 && Y >= cy - 6 && Y <= cy + lh + 6;
      }
    }
    if (hidden < fewest) fewest = hidden, lx = cx, ly = cy;
  }
  out += "<g class=\"legend\">\n<rect x=\"" + fmt("%.2f", lx) + "\" y=\"" + fmt("%.2f", ly) +
         "\" width=\"" + fmt("%.2f", lw) + "\" height=\"" + fmt("%.2f", lh) +
         "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n";
  for (size_t i = 0; i < panel.curves.size(); ++i) {
    double y = ly + 12 + 16.0 * double(i);
    out += "<line x1=\"" + fmt("%.2f", lx + 6) + "\" y1=\"" + fmt("%.2f", y) + "\" x2=\"" +
           fmt("%.2f", lx + 24) + "\" y2=\"" + fmt("%.2f", y) + "\" stroke=\"" +
           kColors[i % std::size(kColors)] + "\" stroke-width=\"2\"/>\n";
    out += "<text x=\"" + fmt("%.2f", lx + 29) + "\" y=\"" + fmt("%.2f", y + 4) + "\">" +
           escape_xml(panel.curves[i].label) + "</text>\n";
  }
  out += "</g>\n</g>\n";
}

}  // namespace

// ---- CSV

CsvLog::CsvLog(std::string path, std::string throughput_column, Mode mode)
    : path_(std::move(path)), throughput_column_(std::move(throughput_column)) {
  if (throughput_column_.empty() ||
      throughput_column_.find_first_of(",\"\n\r") != std::string::npos) {
    throw UsageError("CsvLog: throughput column name '" + throughput_column_ +
                     "' is empty or not a plain CSV name");
  }
  bool write_header = true;
  if (mode == Mode::append) {
    std::ifstream in(path_, std::ios::binary);
    std::string first;
    if (in && read_line(in, first)) {
      if (first != header()) {
        throw IoError(path_ + ": cannot append: the header is '" + first + "', expected '" +
                      header() + "'");
      }
      write_header = false;
      // A crash can leave a last line without its newline; start on a fresh line.
      in.clear();
      in.seekg(-1, std::ios::end);
      char last = '\n';
      in.get(last);
      file_ = std::fopen(path_.c_str(), "a");
      if (file_ && last != '\n') std::fputc('\n', file_);
    }
  }
  if (write_header) file_ = std::fopen(path_.c_str(), mode == Mode::append ? "a" : "w");
  if (!file_) throw IoError(path_ + ": cannot open for writing: " + std::strerror(errno));
  if (write_header) {
    std::fputs((header() + "\n").c_str(), file_);
  }
  if (std::fflush(file_) != 0 || std::ferror(file_)) {
    std::fclose(file_);
    file_ = nullptr;
    throw IoError(path_ + ": write failed: " + std::strerror(errno));
  }
}

CsvLog::~CsvLog() {
  if (file_) std::fclose(file_);
}

std::string CsvLog::header() const {
  return "step,epoch,train_loss,train_acc,val_loss,val_acc," + throughput_column_ + ",lr,elapsed_s";
}

void CsvLog::append(const TrainRow& r) {
  std::string line = std::to_string(r.step);
  for (double v : {r.epoch, r.train_loss, r.train_acc, r.val_loss, r.val_acc, r.throughput, r.lr,
                   r.elapsed_s}) {
    line += ',' + cell(v);
  }
  line += '\n';
  if (std::fputs(line.c_str(), file_) < 0 || std::fflush(file_) != 0) {
    throw IoError(path_ + ": write failed: " + std::strerror(errno));
  }
}

std::vector<TrainRow> read_csv_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path + ": cannot open for reading");
  std::string line;
  if (!read_line(in, line)) throw IoError(path + ": empty file, expected a CSV header");
  std::vector<std::string> head = split(line, ',');
  const char* expected[kColumns] = {"step",    "epoch", "train_loss", "train_acc", "val_loss",
                                    "val_acc", nullptr, "lr",         "elapsed_s"};
  bool ok = head.size() == kColumns;
  for (int i = 0; ok && i < kColumns; ++i) ok = i == kThroughputColumn || head[i] == expected[i];
  if (!ok) throw IoError(path + ": header '" + line + "' is not a training log header");

  std::vector<TrainRow> rows;
  for (int lineno = 2; read_line(in, line); ++lineno) {
    if (line.empty()) continue;
    auto bad = [&](const std::string& what) {
      return IoError(path + ":" + std::to_string(lineno) + ": " + what);
    };
    std::vector<std::string> f = split(line, ',');
    if (f.size() != kColumns) {
      throw bad("has " + std::to_string(f.size()) + " fields, expected " +
                std::to_string(kColumns));
    }
    TrainRow r;
    char* end = nullptr;
    errno = 0;
    r.step = std::strtoll(f[0].c_str(), &end, 10);
    if (f[0].empty() || *end != '\0' || errno) throw bad("step '" + f[0] + "' is not an integer");
    double* fields[] = {&r.epoch,   &r.train_loss, &r.train_acc, &r.val_loss,
                        &r.val_acc, &r.throughput, &r.lr,        &r.elapsed_s};
    for (int i = 1; i < kColumns; ++i) {
      if (f[i].empty()) continue;  // not measured: stays NaN
      *fields[i - 1] = std::strtod(f[i].c_str(), &end);
      if (*end != '\0') throw bad(head[i] + " '" + f[i] + "' is not a number");
    }
    rows.push_back(r);
  }
  return rows;
}

// ---- SVG

std::vector<PlotPanel> training_panels(const std::vector<TrainRow>& rows) {
  PlotPanel loss{"Loss", "step", "loss", {{"train", {}}, {"val", {}}}};
  PlotPanel acc{"Accuracy", "step", "accuracy", {{"train", {}}, {"val", {}}}};
  for (const TrainRow& r : rows) {
    double s = double(r.step);
    if (!std::isnan(r.train_loss)) loss.curves[0].xy.emplace_back(s, r.train_loss);
    if (!std::isnan(r.val_loss)) loss.curves[1].xy.emplace_back(s, r.val_loss);
    if (!std::isnan(r.train_acc)) acc.curves[0].xy.emplace_back(s, r.train_acc);
    if (!std::isnan(r.val_acc)) acc.curves[1].xy.emplace_back(s, r.val_acc);
  }
  return {loss, acc};
}

void write_svg_plot(const std::string& path, const std::vector<PlotPanel>& panels,
                    const std::string& title) {
  if (panels.empty()) throw UsageError("write_svg_plot: " + path + ": no panels to draw");
  double top = title.empty() ? 0 : kTitleH;
  double w = kPanelW * double(panels.size()), h = kPanelH + top;
  std::string out;
  out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", w) + "\" height=\"" +
         fmt("%.0f", h) + "\" viewBox=\"0 0 " + fmt("%.0f", w) + " " + fmt("%.0f", h) +
         "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  std::string name = title.empty() ? panels[0].title : title;
  out += "<title>" + escape_xml(name) + "</title>\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!title.empty()) {
    out += "<text class=\"title\" x=\"" + fmt("%.1f", w / 2) +
           "\" y=\"22\" text-anchor=\"middle\" font-size=\"16\" "
           "font-weight=\"bold\">" +
           escape_xml(title) + "</text>\n";
  }
  for (size_t i = 0; i < panels.size(); ++i) svg_panel(out, panels[i], kPanelW * double(i), top);
  out += "</svg>\n";
  write_file_atomic(path, out);
}

void write_svg_plot(const std::string& path, const std::vector<TrainRow>& rows,
                    const std::string& title) {
  write_svg_plot(path, training_panels(rows), title);
}

}  // namespace nabla
