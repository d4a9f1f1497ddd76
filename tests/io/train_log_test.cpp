// Training logs: CSV content byte for byte, resuming a log, reading it back;
// SVG charts that are well-formed XML with one polyline per curve. (The
// ctest io_svg_wellformed also parses a chart with Python's XML parser.)
#include "nabla/train_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "nabla/error.h"

#include "temp_dir.h"

using namespace nabla;
namespace fs = std::filesystem;

namespace {

using nabla::testing_support::TempDir;

std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

TrainRow row(int64_t step, double loss, double acc) {
  TrainRow r;
  r.step = step;
  r.epoch = double(step) / 100;
  r.train_loss = loss;
  r.train_acc = acc;
  r.throughput = 1234.5;
  r.lr = 3e-4;
  r.elapsed_s = double(step) / 10;
  return r;
}

// A small well-formedness check: one root element, every tag closed in order,
// attribute values quoted, '<' never in text, '&' only starting an entity.
// Returns "" or what is wrong.
std::string xml_problem(const std::string& s) {
  static const std::regex entity("^&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);");
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  if (s.rfind("<?xml", 0) == 0) i = s.find("?>") + 2;
  auto bad_amp = [&](size_t from, size_t to) {
    for (size_t k = s.find('&', from); k < to; k = s.find('&', k + 1)) {
      if (!std::regex_search(s.substr(k, 12), entity)) return true;
    }
    return false;
  };
  while (i < s.size()) {
    size_t lt = s.find('<', i);
    if (lt == std::string::npos) lt = s.size();
    if (bad_amp(i, lt)) return "bare '&' in text near offset " + std::to_string(i);
    if (open.empty() && s.find_first_not_of(" \n\r\t", i) < lt)
      return "text outside the root element";
    if (lt == s.size()) break;
    size_t gt = s.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag at " + std::to_string(lt);
    std::string tag = s.substr(lt + 1, gt - lt - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside tag at " + std::to_string(lt);
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1))
        return "closing </" + tag.substr(1) + "> does not match";
      open.pop_back();
    } else {
      bool self_closing = tag.back() == '/';
      if (self_closing) tag.pop_back();
      std::string name = tag.substr(0, tag.find_first_of(" \n\t"));
      std::string attrs = tag.substr(name.size());
      static const std::regex attr_list(R"(^(\s+[A-Za-z_:][-A-Za-z0-9_:.]*="[^"<]*")*\s*$)");
      if (!std::regex_match(attrs, attr_list)) return "malformed attributes in <" + name + ">";
      if (bad_amp(lt, gt)) return "bare '&' in an attribute of <" + name + ">";
      if (open.empty() && roots++ > 0) return "more than one root element";
      if (!self_closing) open.push_back(name);
    }
    i = gt + 1;
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return roots == 1 ? "" : "no root element";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t k = s.find(what); k != std::string::npos; k = s.find(what, k + 1)) ++n;
  return n;
}

}  // namespace

TEST(CsvLog, WritesHeaderAndRowsFlushedAsTheyGo) {
  TempDir dir;
  CsvLog log(dir.file("log.csv"));
  EXPECT_EQ(read_raw(dir.file("log.csv")),
            "step,epoch,train_loss,train_acc,val_loss,val_acc,images_per_s,lr,elapsed_s\n");
  log.append(row(100, 2.302585, 0.125));
  TrainRow v;
  v.step = 200;
  v.val_loss = 1.0 / 3;
  v.val_acc = 0.5;
  v.elapsed_s = 12345.678;
  log.append(v);
  // Read while the log is still open: every row is already in the file.
  EXPECT_EQ(read_raw(dir.file("log.csv")),
            "step,epoch,train_loss,train_acc,val_loss,val_acc,images_per_s,lr,elapsed_s\n"
            "100,1,2.302585,0.125,,,1234.5,0.0003,10\n"
            "200,,,,0.3333333,0.5,,,12345.68\n");
}

TEST(CsvLog, ThroughputColumnIsNamedByTheCaller) {
  TempDir dir;
  CsvLog log(dir.file("gpt.csv"), "tokens_per_s");
  EXPECT_EQ(log.header(),
            "step,epoch,train_loss,train_acc,val_loss,val_acc,tokens_per_s,lr,elapsed_s");
  EXPECT_THROW(CsvLog(dir.file("x.csv"), "a,b"), UsageError);
  EXPECT_THROW(CsvLog(dir.file("x.csv"), ""), UsageError);
  EXPECT_THROW(CsvLog(dir.file("no/such/dir/x.csv")), IoError);
}

TEST(CsvLog, AppendResumesALog) {
  TempDir dir;
  std::string path = dir.file("log.csv");
  {
    CsvLog(path, "images_per_s", CsvLog::Mode::append).append(row(1, 1, 0));
  }  // no file yet: header first
  { CsvLog(path, "images_per_s", CsvLog::Mode::append).append(row(2, 0.5, 0.5)); }
  std::vector<TrainRow> rows = read_csv_log(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_EQ(rows[1].step, 2);
  EXPECT_EQ(count(read_raw(path), "step,"), 1u);

  // A crash mid-row leaves no newline; the next row starts on its own line.
  write_raw(path, read_raw(path) + "3,0.03,0.4");
  { CsvLog(path, "images_per_s", CsvLog::Mode::append).append(row(4, 0.25, 0.75)); }
  EXPECT_NE(read_raw(path).find("\n3,0.03,0.4\n4,"), std::string::npos);

  // Truncate mode starts over; append to some other file is refused.
  { CsvLog log(path); }
  EXPECT_TRUE(read_csv_log(path).empty());
  EXPECT_THROW(CsvLog(path, "tokens_per_s", CsvLog::Mode::append), IoError);
}

TEST(CsvLog, ReadsBackWhatItWrote) {
  TempDir dir;
  std::string path = dir.file("log.csv");
  {
    CsvLog log(path, "tokens_per_s");
    log.append(row(10, 2.5, 0.25));
    TrainRow v;
    v.step = 20;
    v.val_loss = 1.75;
    v.train_loss = INFINITY;  // a diverged step is logged, not dropped
    log.append(v);
  }
  std::vector<TrainRow> rows = read_csv_log(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].step, 10);
  EXPECT_EQ(rows[0].epoch, 0.1);
  EXPECT_EQ(rows[0].train_loss, 2.5);
  EXPECT_EQ(rows[0].train_acc, 0.25);
  EXPECT_TRUE(std::isnan(rows[0].val_loss));
  EXPECT_EQ(rows[0].throughput, 1234.5);
  EXPECT_EQ(rows[0].lr, 3e-4);
  EXPECT_EQ(rows[0].elapsed_s, 1.0);
  EXPECT_EQ(rows[1].val_loss, 1.75);
  EXPECT_TRUE(std::isinf(rows[1].train_loss));
  EXPECT_TRUE(std::isnan(rows[1].epoch));
}

TEST(CsvLog, MalformedFilesNameFileAndLine) {
  TempDir dir;
  std::string head = "step,epoch,train_loss,train_acc,val_loss,val_acc,images_per_s,lr,elapsed_s\n";
  auto expect_error = [&](const std::string& text, const std::string& what) {
    write_raw(dir.file("bad.csv"), text);
    try {
      read_csv_log(dir.file("bad.csv"));
      ADD_FAILURE() << "no error, expected " << what;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error("", dir.file("bad.csv") + ": empty file");
  expect_error("a,b,c\n", "is not a training log header");
  expect_error(head + "1,,,,,,,,\n2,,,\n", dir.file("bad.csv") + ":3: has 4 fields, expected 9");
  expect_error(head + "x,,,,,,,,\n", ":2: step 'x' is not an integer");
  expect_error(head + "1,,abc,,,,,,\n", ":2: train_loss 'abc' is not a number");
  EXPECT_THROW(read_csv_log(dir.file("missing.csv")), IoError);
}

TEST(SvgPlot, TrainingCurvesAreWellFormedSvg) {
  TempDir dir;
  std::vector<TrainRow> rows;
  for (int s = 0; s <= 1000; s += 50) {
    TrainRow r = row(s, 2.3 * std::exp(-s / 300.0), 1 - std::exp(-s / 200.0));
    if (s % 250 == 0) r.val_loss = r.train_loss + 0.1, r.val_acc = r.train_acc - 0.05;
    rows.push_back(r);
  }
  write_svg_plot(dir.file("plot.svg"), rows, "ViT <tiny> & \"fast\"");
  EXPECT_EQ(dir.listing().size(), 1u);  // no temporary left behind
  std::string svg = read_raw(dir.file("plot.svg"));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("ViT &lt;tiny&gt; &amp; &quot;fast&quot;"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 4u);
  EXPECT_EQ(count(svg, "data-label=\"train\""), 2u);
  EXPECT_EQ(count(svg, "data-label=\"val\""), 2u);
  EXPECT_NE(svg.find(">Loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">Accuracy</text>"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  // Ticks on round numbers covering the data.
  EXPECT_NE(svg.find(">1000</text>"), std::string::npos);
  EXPECT_NE(svg.find(">0.0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">2.5</text>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);  // self-contained
}

TEST(SvgPlot, DegenerateDataStillDraws) {
  TempDir dir;
  PlotPanel empty{"Nothing", "step", "loss", {{"train", {}}}};
  PlotPanel one{"One point", "step", "loss", {{"val", {{5, 2.0}}}}};
  PlotPanel flat{"Flat",
                 "step",
                 "loss",
                 {{"train", {{0, 1.0}, {10, 1.0}, {20, NAN}, {30, INFINITY}, {40, 1.0}}}}};
  write_svg_plot(dir.file("plot.svg"), {empty, one, flat});
  std::string svg = read_raw(dir.file("plot.svg"));
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"panel\""), 3u);
  EXPECT_NE(svg.find(">no data</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_NE(svg.find("<circle"), std::string::npos);  // the single point shows as a dot
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  std::smatch m;
  std::string flat_part = svg.substr(svg.rfind("class=\"panel\""));
  ASSERT_TRUE(std::regex_search(flat_part, m, std::regex("points=\"([^\"]*)\"")));
  EXPECT_EQ(count(m[1].str(), ","), 3u);  // NaN and inf points skipped
  EXPECT_THROW(write_svg_plot(dir.file("none.svg"), std::vector<PlotPanel>{}), UsageError);
  EXPECT_THROW(write_svg_plot(dir.file("no/dir/plot.svg"), {flat}), IoError);
}

TEST(SvgPlot, XmlCheckerCatchesBrokenFiles) {
  EXPECT_EQ(xml_problem("<svg><g></g></svg>"), "");
  EXPECT_NE(xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(xml_problem("<svg a=1></svg>"), "");
  EXPECT_NE(xml_problem("<svg>a & b</svg>"), "");
  EXPECT_NE(xml_problem("<svg/><svg/>"), "");
  EXPECT_NE(xml_problem("<svg>"), "");
}
