#include <fstream>
#include <cmath>

#include "vit_common.h"

namespace nabla::cli {

struct TrainLogFiles::Impl {
  std::string csv, svg;
  std::ofstream out;
  std::vector<std::vector<double>> rows;
};

TrainLogFiles::TrainLogFiles(const std::string& checkpoint, const std::string& csv) : impl_(std::make_unique<Impl>()) {
  std::string base = checkpoint;
  if (base.size() > 12 && base.substr(base.size() - 12) == ".safetensors") base.resize(base.size() - 12);
  impl_->csv = !csv.empty() ? csv : base.empty() ? "" : base + ".csv";
  impl_->svg = base.empty() ? "" : base + ".svg";
  if (!impl_->csv.empty()) {
    impl_->out.open(impl_->csv);
    impl_->out << "step,epoch,train_loss,train_acc,test_loss,test_acc,images_per_s,lr,seconds\n";
  }
}
TrainLogFiles::~TrainLogFiles() = default;

void TrainLogFiles::row(const std::vector<double>& v) {
  impl_->rows.push_back(v);
  if (!impl_->out.is_open()) return;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) impl_->out << ',';
    if (std::isfinite(v[i])) impl_->out << v[i];
  }
  impl_->out << '\n';
  impl_->out.flush();
}

void TrainLogFiles::plot() {}

}  // namespace nabla::cli
