#include "train_loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "nabla/error.h"
#include "nabla/optim.h"

namespace nabla::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t sum_over_ranks(dist::Communicator& comm, int64_t mine) {
  std::vector<int64_t> all(size_t(comm.size()));
  comm.all_gather_bytes(&mine, all.data(), sizeof mine);
  int64_t sum = 0;
  for (int64_t v : all) sum += v;
  return sum;
}

}  // namespace

std::optional<Checkpoint> load_resume_checkpoint(const TrainLoopArgs& args) {
  if (args.resume.empty()) return std::nullopt;
  Checkpoint c = load_checkpoint(args.resume);
  if (!c.has_position) {
    throw IoError(args.resume + ": has no training position (\"nabla.train\"); it is a weights-only checkpoint");
  }
  return c;
}

ExecOptions exec_options(const TrainLoopArgs& args) {
  return ExecOptions{.threads = args.threads,
                     .check_finite = args.check_finite,
                     .bf16_matmul = args.bf16_matmul,
                     .backend = args.backend};
}

int32_t step_seed(uint64_t seed, int64_t step) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + uint64_t(step) + 1;
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  return static_cast<int32_t>(z >> 33);
}

// The CSV log of the curves (beside the checkpoint, or at --log) and their
// SVG plot (beside the checkpoint). No paths, no files. A resumed run appends.
struct TrainingLoop::Logs {
  std::unique_ptr<CsvLog> csv;
  std::string svg, title;

  Logs(const std::string& checkpoint, const std::string& csv_arg, bool resume, const std::string& throughput_column) {
    std::string base = checkpoint;
    const std::string ext = ".safetensors";
    if (base.size() > ext.size() && base.compare(base.size() - ext.size(), ext.size(), ext) == 0) {
      base.resize(base.size() - ext.size());
    }
    const std::string csv_path = !csv_arg.empty() ? csv_arg : base.empty() ? "" : base + ".csv";
    // The checkpoint's folder is created on demand, like its files.
    for (const std::string& p : {checkpoint, csv_path}) {
      std::filesystem::path parent = std::filesystem::path(p).parent_path();
      std::error_code ec;
      if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    }
    if (!csv_path.empty()) {
      csv = std::make_unique<CsvLog>(csv_path, throughput_column, resume ? CsvLog::Mode::append : CsvLog::Mode::truncate);
    }
    if (!base.empty()) svg = base + ".svg";
    title = base.empty() ? "" : base.substr(base.find_last_of('/') + 1);
  }
  void row(const TrainRow& r) {
    if (csv) csv->append(r);
  }
  void plot() {
    if (csv && !svg.empty()) write_svg_plot(svg, read_csv_log(csv->path()), title);
  }
};

// The steps since the last progress line: their mean loss, accuracy and rate.
struct TrainingLoop::Window {
  double loss = 0, seconds = 0;
  int64_t steps = 0, correct = 0, seen = 0;
  bool accuracy = false;
};

TrainingLoop::TrainingLoop(TrainStep& step, TrainingTask& task, const nn::Params& params, const TrainLoopArgs& args,
                           TrainingLoopOptions options, const Checkpoint* resume)
    : step_(step), task_(task), params_(params), args_(args), opt_(std::move(options)), window_(new Window) {
  pos_.seed = args.seed;
  if (resume) {
    try {
      step_.load_optimizer_state(resume->file.tensors, resume->position.step);
    } catch (const IoError& e) {
      throw IoError(resume->path + ": " + e.what());
    }
    pos_ = resume->position;
    resumed_ = true;
  }
  per_epoch_ = task_.batches_per_epoch();
  if (per_epoch_ > 0) opt_.schedule_steps = per_epoch_ * opt_.epochs;
  last_step_ = args.max_steps > 0 ? std::min(args.max_steps, opt_.schedule_steps) : opt_.schedule_steps;
  if (dist::Communicator* comm = step_.communicator()) {
    // Ranks that disagree on the schedule or the position would part ways
    // without an error: they stop here instead, before the first step.
    dist::check_same(*comm, "the training options",
                     fmt::format("{} lr {} wd {} warmup {} clip {} schedule {} last step {} {}, at step {} epoch {} batch "
                                 "{} seed {}, micro-batches {}, eval every {}; config {}",
                                 opt_.command, args.lr, args.weight_decay, args.warmup, args.clip, opt_.schedule_steps,
                                 last_step_, opt_.batch, pos_.step, pos_.epoch, pos_.batch, pos_.seed,
                                 opt_.micro_batches, args.eval_every, opt_.config_json));
    leader_ = comm->rank() == 0;
  }
  // Logs and checkpoints are rank 0's.
  logs_ = leader_ ? std::make_unique<Logs>(args.save, args.log, resumed_, opt_.items + "_per_s")
                  : std::make_unique<Logs>("", "", false, "");
}

TrainingLoop::~TrainingLoop() = default;

std::string TrainingLoop::describe() const {
  const Executor& ex = step_.executor();
  std::string schedule = per_epoch_ > 0 ? fmt::format("{} epochs x {} steps", opt_.epochs, per_epoch_)
                                        : fmt::format("{} steps", opt_.schedule_steps);
  std::string replicas = step_.replicas() > 1 ? fmt::format(", {} replicas", step_.replicas()) : "";
  if (const dist::Communicator* comm = step_.communicator()) {
    replicas = fmt::format(", {} replica{} per process; {}{}", step_.replicas(), step_.replicas() > 1 ? "s" : "",
                           comm->describe(), step_.sharded() ? ", optimizer state sharded" : "");
  }
  return fmt::format(
      "training: {} of {}, AdamW lr {} (warmup {} steps, cosine to {:.2g}), wd {}, clip {}; matmul {}, {} threads{}; "
      "arena {:.1f} MiB planned ({:.1f} MiB without reuse){}",
      schedule, opt_.batch, args_.lr, args_.warmup, args_.lr * opt_.min_lr_fraction, args_.weight_decay, args_.clip,
      args_.bf16_matmul ? "bf16" : "f32", step_.threads(), replicas, ex.memory().arena_bytes / 1048576.0,
      ex.memory().unplanned_bytes / 1048576.0, step_.replicas() > 1 ? " each" : "");
}

// Every rank calls: a sharded optimizer's moments are gathered to rank 0,
// which writes.
void TrainingLoop::save() {
  if (args_.save.empty()) return;
  step_.with_optimizer_state([&](const optim::AdamW& optimizer) {
    if (!leader_) return;
    if (opt_.save) return opt_.save(optimizer, pos_);
    save_checkpoint(args_.save, opt_.config_json, params_, &optimizer, &pos_);
  });
}

void TrainingLoop::evaluate_and_save() {
  if (!leader_) {
    // Rank 0 evaluates and writes; the others keep the position and take
    // part in the save.
    if (per_epoch_ > 0 && pos_.batch == per_epoch_) {
      ++pos_.epoch;
      pos_.batch = 0;
    }
    save();
    return;
  }
  last_eval_ = task_.evaluate();
  // A resume of a finished run evaluates at its last epoch.
  const std::string where = per_epoch_ > 0 ? fmt::format("epoch {}/{}", std::min(pos_.epoch + 1, opt_.epochs), opt_.epochs)
                                           : fmt::format("step {}", pos_.step);
  std::string accuracy;
  if (last_eval_.accuracy >= 0) {
    accuracy = fmt::format(", {} accuracy {:.2f}% ({} {})", opt_.eval_name, 100 * last_eval_.accuracy,
                           last_eval_.count, opt_.items);
  }
  fmt::print("{}: {} loss {:.4f}{}, {} elapsed\n", where, opt_.eval_name, last_eval_.loss, accuracy,
             format_duration(seconds_since(start_)));
  std::fflush(stdout);  // progress goes to stderr: keep the two in order in logs
  TrainRow row;
  row.step = pos_.step;
  if (per_epoch_ > 0) row.epoch = double(pos_.epoch) + double(pos_.batch) / double(per_epoch_);
  row.val_loss = last_eval_.loss;
  if (last_eval_.accuracy >= 0) row.val_acc = last_eval_.accuracy;
  row.elapsed_s = seconds_since(start_);
  logs_->row(row);
  if (per_epoch_ > 0 && pos_.batch == per_epoch_) {
    ++pos_.epoch;
    pos_.batch = 0;
  }
  save();
  if (!args_.save.empty()) logs_->plot();
}

void TrainingLoop::step_once() {
  auto start = Clock::now();
  // Each micro-batch's loss is weighted for its share of the step (the
  // task's business), so their sum over the count is the step's loss.
  double step_loss = 0;
  for (int m = 0; m < opt_.micro_batches; ++m) {
    task_.load_batch(pos_, m);
    step_.run();
    step_loss += step_.loss();
  }
  const float loss = float(step_loss / opt_.micro_batches);
  lr_ = optim::warmup_cosine(pos_.step, args_.warmup, opt_.schedule_steps, args_.lr, args_.lr * opt_.min_lr_fraction);
  step_.update(lr_, args_.clip);
  ++pos_.step;
  if (per_epoch_ > 0) ++pos_.batch;
  ++steps_this_run_;
  int64_t correct = task_.correct_predictions();
  if (correct >= 0 && step_.communicator()) correct = sum_over_ranks(*step_.communicator(), correct);
  const double seconds = seconds_since(start);
  train_seconds_ += seconds;

  if (!std::isfinite(loss)) {
    throw Error(fmt::format("{}: the loss became {} at step {}; try a lower --lr", opt_.command, loss, pos_.step));
  }
  Window& w = *window_;
  w.loss += loss;
  w.seconds += seconds;
  ++w.steps;
  w.accuracy = correct >= 0;
  w.correct += std::max<int64_t>(correct, 0);
  w.seen += opt_.examples_per_step;
}

void TrainingLoop::run() {
  start_ = Clock::now();
  if (resumed_) {
    fmt::print("resumed from {} at step {}{}\n", args_.resume, pos_.step,
               per_epoch_ > 0 ? fmt::format(" (epoch {}, batch {})", pos_.epoch + 1, pos_.batch) : "");
    std::fflush(stdout);
  }
  Progress progress(args_.log_every);
  const bool epochs = per_epoch_ > 0;
  bool epoch_started = false, stop = pos_.step >= last_step_ || (epochs && pos_.epoch >= opt_.epochs);
  while (!stop) {
    if (epochs && !epoch_started) {
      task_.start_epoch(pos_.epoch, pos_.batch);
      epoch_started = true;
    }
    step_once();
    // --max-minutes counts training time only (batches, steps, updates),
    // not evaluation, so budgets compare across frameworks and eval settings.
    bool out_of_time = args_.max_minutes > 0 && train_seconds_ >= 60 * args_.max_minutes;
    // Rank 0's clock decides for every rank.
    if (args_.max_minutes > 0 && step_.communicator()) step_.communicator()->broadcast(&out_of_time, sizeof out_of_time, 0);
    stop = pos_.step >= last_step_ || out_of_time;
    const bool epoch_done = epochs && pos_.batch == per_epoch_;

    Window& w = *window_;
    const double rate = double(steps_this_run_ * opt_.items_per_step) / std::max(train_seconds_, 1e-9);
    const std::string where = epochs ? fmt::format("epoch {}/{} ", pos_.epoch + 1, opt_.epochs) : "";
    const std::string accuracy = w.accuracy ? fmt::format(" acc {:.1f}%", 100.0 * w.correct / w.seen) : "";
    const bool report = w.steps >= args_.log_every || stop;
    if (leader_) progress.update(fmt::format("{}step {}/{} loss {:.4f}{} {:.0f} {} lr {:.2e} ETA {}", where, pos_.step, last_step_,
                                w.loss / w.steps, accuracy, rate, opt_.rate_unit, lr_,
                                format_duration(double(last_step_ - pos_.step) * opt_.items_per_step / rate)),
                    report);
    if (report) {
      TrainRow row;
      row.step = pos_.step;
      if (epochs) row.epoch = double(pos_.epoch) + double(pos_.batch) / double(per_epoch_);
      row.train_loss = w.loss / w.steps;
      if (w.accuracy) row.train_acc = double(w.correct) / double(w.seen);
      row.throughput = double(w.steps * opt_.items_per_step) / std::max(w.seconds, 1e-9);
      row.lr = lr_;
      row.elapsed_s = seconds_since(start_);
      logs_->row(row);
      w = Window{};
    }

    if (epoch_done || stop || (args_.eval_every > 0 && pos_.step % args_.eval_every == 0)) {
      progress.finish();
      evaluate_and_save();
      if (epoch_done) epoch_started = false;
      stop = stop || (epochs && pos_.epoch >= opt_.epochs);
    } else if (args_.save_every > 0 && pos_.step % args_.save_every == 0) {
      save();
    }
  }
  // Nothing left to train (a resume at the schedule's end, --max-steps
  // reached before): the model as it stands, evaluated and saved.
  if (steps_this_run_ == 0) evaluate_and_save();
  progress.finish();

  std::string final_figure = last_eval_.accuracy >= 0
                                 ? fmt::format("{} accuracy {:.2f}%", opt_.eval_name, 100 * last_eval_.accuracy)
                                 : fmt::format("{} loss {:.4f}", opt_.eval_name, last_eval_.loss);
  fmt::print("done: {} steps in {} of training ({:.0f} {}/s); final {}\n", steps_this_run_,
             format_duration(train_seconds_), double(steps_this_run_ * opt_.items_per_step) / std::max(train_seconds_, 1e-9),
             opt_.items, final_figure);
  if (!args_.save.empty()) fmt::print("checkpoint: {}\n", args_.save);
  const TrainStep::CommunicationTime comm = step_.communication();
  if (comm.runs > 0) {
    fmt::print("gradient reduction: {:.1f} MiB a step, at work {:.1f} ms a step (folding, sending, waiting on the other "
               "processes), {:.1f} ms of it after the backward pass\n",
               double(comm.bytes) / 1048576.0, 1e3 * comm.seconds / double(comm.runs),
               1e3 * comm.exposed_seconds / double(comm.runs));
  }
  const std::string profile = step_.executor().profile();
  if (!profile.empty()) fmt::print("kernel time per op (training step):\n{}", profile);
}

}  // namespace nabla::cli
