// The training loop every `nabla train` command runs. The model's command
// builds its TrainStep and supplies a TrainingTask (its batches, its
// accuracy if it has one, its evaluation); the loop owns the rest: the
// learning-rate schedule, epochs and steps, the progress line, the CSV log
// and SVG plot, the finite-loss check, checkpoints and resume.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "nabla/checkpoint.h"
#include "nabla/train_log.h"
#include "nabla/trainer.h"

namespace nabla::cli {

// What the training commands share on their command lines.
struct TrainLoopArgs {
  double lr = 1e-3;
  double weight_decay = 0.05;
  int64_t warmup = 100;
  double clip = 1.0;
  int threads = 0;  // 0: every core
  uint64_t seed = 1;
  int64_t max_steps = 0;   // stop after this many steps (0: the whole schedule, which keeps its length)
  double max_minutes = 0;  // stop after this much training time (evaluation not counted); 0: no limit
  int64_t eval_every = 0;  // steps between evaluations and checkpoints; 0: at epoch ends only
  int64_t save_every = 0;  // also save the checkpoint every N steps
  int log_every = 50;      // steps per progress line in logs, and per CSV row
  std::string save;        // checkpoint path ("" = none); the CSV and SVG go beside it
  std::string resume;      // training checkpoint to continue
  std::string log;         // CSV path, overriding the one beside the checkpoint
  bool check_finite = false;
  bool bf16_matmul = false;
  std::string backend = "cpu";  // which backend runs the step (backend_names())
  // The job's processes when mpirun started several (main sets it): each
  // trains its share of every batch (TrainStep's comm); null otherwise.
  dist::Communicator* comm = nullptr;
  bool shard_optimizer = false;  // ZeRO-1 across the job's processes (TrainStep's shard_optimizer)
};

// The checkpoint `args.resume` names, when given, with its training position;
// IoError when it has none (a weights-only checkpoint).
std::optional<Checkpoint> load_resume_checkpoint(const TrainLoopArgs& args);

// The step's execution options from the command line.
ExecOptions exec_options(const TrainLoopArgs& args);

// Per-step dropout seed: a pure function of (run seed, step), so a resumed run
// draws the same masks.
int32_t step_seed(uint64_t seed, int64_t step);

struct Evaluation {
  double loss = 0;
  double accuracy = -1;  // < 0: the task has none
  int64_t count = 0;     // examples evaluated
};

// What a model brings to the loop.
class TrainingTask {
 public:
  virtual ~TrainingTask() = default;
  // Batches in one epoch; 0 when batches are drawn by step, with no epochs.
  virtual int64_t batches_per_epoch() const = 0;
  // Starts `epoch`, its first `skip` batches already used (a resumed run).
  virtual void start_epoch(int64_t epoch, int64_t skip) {}
  // Writes the next batch (the one at `pos`) into the step's input leaves;
  // with several micro-batches a step, its micro_batch'th part.
  virtual void load_batch(const TrainPosition& pos, int micro_batch) = 0;
  // After a step: correct predictions in its batch, or -1 without accuracy.
  virtual int64_t correct_predictions() { return -1; }
  virtual Evaluation evaluate() = 0;
};

struct TrainingLoopOptions {
  std::string command;            // "train vit": names the loop in errors
  int64_t epochs = 0;             // 0 with a task that has no epochs
  int64_t schedule_steps = 0;     // the learning-rate schedule's length
  double min_lr_fraction = 0.01;  // the cosine's floor, as a fraction of the peak
  int64_t examples_per_step = 1;  // for the accuracy window
  int64_t items_per_step = 1;     // for the throughput: images or tokens a step
  std::string items = "images";   // "tokens"
  std::string rate_unit = "img/s";  // "tok/s", for the progress line
  std::string batch = "batch 1";  // what a step takes, for the banner ("batch 128", "8 x 256 tokens")
  std::string eval_name = "test";  // "validation"
  std::string config_json;        // the model's config, saved in checkpoints
  int micro_batches = 1;          // runs summed into each step (TrainStep's)
  // Writes the checkpoint in place of save_checkpoint(args.save, ...) (a
  // command whose checkpoint is a folder of other tools' files).
  std::function<void(const optim::AdamW&, const TrainPosition&)> save;
};

class TrainingLoop {
 public:
  // `resume` (may be null) restores the optimizer state and the position.
  TrainingLoop(TrainStep& step, TrainingTask& task, const nn::Params& params, const TrainLoopArgs& args,
               TrainingLoopOptions options, const Checkpoint* resume);
  ~TrainingLoop();

  // The schedule's line for the banner ("AdamW lr ... ; arena ...").
  std::string describe() const;
  // Trains until the schedule, --max-steps or --max-minutes ends it, then
  // prints the summary and, under NABLA_PROFILE, the step's kernel times.
  void run();

 private:
  void step_once();
  void evaluate_and_save();
  void save();

  TrainStep& step_;
  TrainingTask& task_;
  const nn::Params& params_;
  const TrainLoopArgs& args_;
  TrainingLoopOptions opt_;
  TrainPosition pos_;
  bool resumed_ = false;
  bool leader_ = true;  // prints, logs, evaluates and saves: rank 0 of a distributed run
  int64_t per_epoch_ = 0, last_step_ = 0, steps_this_run_ = 0;
  double train_seconds_ = 0, lr_ = 0;
  Evaluation last_eval_;
  std::chrono::steady_clock::time_point start_;
  struct Window;
  std::unique_ptr<Window> window_;
  struct Logs;
  std::unique_ptr<Logs> logs_;
};

}  // namespace nabla::cli
