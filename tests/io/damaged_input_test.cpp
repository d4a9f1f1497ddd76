// Readers on damaged input: strict JSON fields in checkpoints, model configs
// whose parameters the file cannot hold, checkpoints of another architecture
// or whose tensors do not fit (nothing loaded),
// stale temporaries of killed writers, shapes too large to describe, an IDX
// .gz that inflates far beyond its header. Inputs the fuzzers (fuzz/) found
// are in fuzz_regressions_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nabla/checkpoint.h"
#include "nabla/config.h"
#include "nabla/data.h"
#include "nabla/error.h"
#include "nabla/io.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/vit.h"
#include "nabla/ops.h"
#include "nabla/optim.h"
#include "ops/internal_ops.h"

#include "temp_dir.h"

using namespace nabla;
namespace fs = std::filesystem;

namespace {

using nabla::testing_support::TempDir;

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

models::VitConfig small_vit() {
  models::VitConfig c = models::vit_preset("fmnist");
  c.img_size = 8;
  c.patch_size = 4;
  c.embed_dim = 8;
  c.depth = 2;
  c.num_heads = 2;
  c.num_classes = 3;
  return c;
}

models::Gpt2Config small_gpt2() {
  models::Gpt2Config c = models::gpt2_preset("gpt2-small-byte");
  c.vocab_size = 16;
  c.n_positions = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

}  // namespace

TEST(ModelConfig, ParameterCountMatchesTheBuiltModel) {
  for (bool token : {true, false}) {
    for (bool qkv_bias : {true, false}) {
      models::VitConfig c = small_vit();
      c.global_pool = token ? "token" : "avg";
      c.qkv_bias = qkv_bias;
      c.mlp_ratio = 1.5;
      EXPECT_EQ(c.parameter_count(), models::Vit(c, 1).params().count()) << c.to_json();
    }
  }
  for (bool bias : {true, false}) {
    models::Gpt2Config c = small_gpt2();
    c.bias = bias;
    EXPECT_EQ(c.parameter_count(), models::Gpt2(c, 1).params().count()) << c.to_json();
  }
  // The presets, without building them.
  EXPECT_EQ(models::vit_preset("vit-tiny").parameter_count(), 5717416);  // timm's vit_tiny_patch16_224
  EXPECT_EQ(models::gpt2_preset("gpt2").parameter_count(), 124439808);   // Hugging Face's gpt2
}

// One list of fields writes and reads a config: what it writes reads back;
// optional fields keep their values when absent and are checked when present.
TEST(ConfigFields, WritesAndReadsOneListOfFields) {
  struct Config {
    int64_t size = 0;
    uint64_t seed = 0;
    double rate = 0.5;
    bool flag = true;
    std::string name = "default";
  };
  auto fields = [](Config& c) {
    ConfigFields f("test config", "test");
    f.required("size", c.size, 1).required("seed", c.seed).optional("rate", c.rate).optional("flag", c.flag).optional(
        "name", c.name);
    return f;
  };
  Config a{7, 18446744073709551615ull, 0.25, false, "x"};
  Config b;
  fields(b).from_json(fields(a).to_json());
  EXPECT_EQ(b.size, 7);
  EXPECT_EQ(b.seed, 18446744073709551615ull);
  EXPECT_EQ(b.rate, 0.25);
  EXPECT_FALSE(b.flag);
  EXPECT_EQ(b.name, "x");

  Config c;
  fields(c).from_json(R"({"architecture": "test", "size": 3, "seed": 1})");
  EXPECT_EQ(c.rate, 0.5);
  EXPECT_TRUE(c.flag);
  EXPECT_EQ(c.name, "default");

  auto error = [&](const std::string& json) { return error_of<IoError>([&] { fields(c).from_json(json); }); };
  EXPECT_NE(error(R"({"architecture": "test", "seed": 1})").find("test config: missing \"size\""), std::string::npos);
  EXPECT_NE(error(R"({"architecture": "test", "size": 0, "seed": 1})").find("\"size\" must be an integer in [1,"),
            std::string::npos);
  EXPECT_NE(error(R"({"architecture": "test", "size": 1, "seed": 1, "flag": "yes"})")
                .find("\"flag\" must be true or false, got \"yes\""),
            std::string::npos);
  EXPECT_NE(error(R"({"architecture": "test", "size": 1, "seed": 1, "rate": "fast"})").find("\"rate\" must be a number"),
            std::string::npos);
  EXPECT_NE(error(R"({"architecture": "test", "size": 1, "seed": -1})").find("\"seed\" must be a non-negative"),
            std::string::npos);
  EXPECT_NE(error(R"({"architecture": "other", "size": 1, "seed": 1})").find("architecture is \"other\", expected \"test\""),
            std::string::npos);
  EXPECT_NE(error("{").find("test config: not valid JSON"), std::string::npos);
}

TEST(ModelConfig, FieldsMustHaveTheirTypes) {
  std::string vit = small_vit().to_json();
  auto with = [&](const std::string& key, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(vit);
    j[key] = nlohmann::json::parse(value);
    return j.dump();
  };
  // A float where an integer belongs (1e300 would overflow a conversion).
  EXPECT_NE(error_of<IoError>([&] { models::VitConfig::from_json(with("embed_dim", "1e300")); })
                .find("\"embed_dim\" must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of<IoError>([&] { models::VitConfig::from_json(with("depth", "2.5")); }).find("\"depth\""),
            std::string::npos);
  // A non-string architecture is a clean error, not a JSON library exception.
  EXPECT_NE(error_of<IoError>([&] { models::VitConfig::from_json(with("architecture", "7")); })
                .find("architecture is 7, expected \"vit\""),
            std::string::npos);
  EXPECT_NE(error_of<IoError>([&] { models::Gpt2Config::from_json("[1]"); }).find("not a JSON object"),
            std::string::npos);
  // Sizes whose products would overflow.
  EXPECT_NE(error_of<UsageError>([&] { models::VitConfig::from_json(with("mlp_ratio", "1e300")); })
                .find("mlp_ratio"),
            std::string::npos);
  EXPECT_NE(error_of<UsageError>([&] { models::VitConfig::from_json(with("img_size", "4611686018427387904")); })
                .find("at most"),
            std::string::npos);
}

TEST(TrainPosition, FieldsMustBeNonNegativeIntegers) {
  for (const char* bad : {R"({"step": 1.5, "epoch": 0, "batch": 0, "seed": 1})",
                          R"({"step": 1, "epoch": -1, "batch": 0, "seed": 1})",
                          R"({"step": 1, "epoch": 0, "batch": 0, "seed": -1})",
                          R"({"step": 1, "epoch": 0, "batch": 1e300, "seed": 1})", R"([])"}) {
    std::string m = error_of<IoError>([&] { TrainPosition::from_json(bad, "ck.safetensors"); });
    EXPECT_NE(m.find("ck.safetensors: bad nabla.train metadata"), std::string::npos) << bad << ": " << m;
  }
  TrainPosition p = TrainPosition::from_json(R"({"step": 3, "epoch": 1, "batch": 2, "seed": 18446744073709551615})",
                                             "ck.safetensors");
  EXPECT_EQ(p.seed, 18446744073709551615ull);
}

TEST(Checkpoint, ConfigOfAnotherArchitectureNamesTheFile) {
  TempDir dir;
  models::Gpt2 gpt2(small_gpt2(), 1);
  save_checkpoint(dir.file("gpt2.safetensors"), small_gpt2().to_json(), gpt2.params());
  Checkpoint ckpt = load_checkpoint(dir.file("gpt2.safetensors"));
  std::string m = error_of<IoError>([&] { models::vit_config_from_checkpoint(ckpt); });
  EXPECT_NE(m.find(dir.file("gpt2.safetensors") + ": vit config: architecture is \"gpt2\", expected \"vit\""),
            std::string::npos)
      << m;
  EXPECT_NO_THROW(models::gpt2_config_from_checkpoint(ckpt));
}

TEST(Checkpoint, ConfigLargerThanTheFileIsRefusedBeforeBuildingTheModel) {
  TempDir dir;
  models::Vit vit(small_vit(), 1);
  models::VitConfig huge = small_vit();
  huge.embed_dim = 1 << 20;  // a damaged config: ~10^13 parameters
  huge.num_heads = 1;
  save_checkpoint(dir.file("vit.safetensors"), huge.to_json(), vit.params());
  Checkpoint ckpt = load_checkpoint(dir.file("vit.safetensors"));
  std::string m = error_of<IoError>([&] { models::vit_config_from_checkpoint(ckpt); });
  EXPECT_NE(m.find("its config describes a model of"), std::string::npos) << m;
  EXPECT_NE(m.find(dir.file("vit.safetensors")), std::string::npos) << m;
}

TEST(Checkpoint, OptimizerStateErrorsNameTheFile) {
  TempDir dir;
  models::Vit vit(small_vit(), 1);
  TrainPosition pos;
  save_checkpoint(dir.file("weights.safetensors"), small_vit().to_json(), vit.params(), nullptr, &pos);
  Checkpoint ckpt = load_checkpoint(dir.file("weights.safetensors"));
  std::vector<optim::Slot> slots;
  for (const auto& [name, t] : vit.params().list()) slots.push_back({name, t});
  optim::AdamW adamw(slots, {}, 1);
  std::string m = error_of<IoError>([&] { load_optimizer_state(ckpt, adamw); });
  EXPECT_NE(m.find(dir.file("weights.safetensors") + ": optimizer state: missing"), std::string::npos) << m;
}

// A checkpoint whose last tensors do not fit (another class count) is
// refused with nothing loaded: every parameter and moment before the
// mismatch keeps its value, where copying while checking had overwritten
// them.
TEST(Checkpoint, AMismatchLoadsNothing) {
  TempDir dir;
  models::VitConfig other = small_vit();
  other.num_classes = 4;
  models::Vit source(other, 2);
  std::vector<optim::Slot> source_slots;
  for (const auto& [name, t] : source.params().list()) source_slots.push_back({name, t});
  optim::AdamW source_adamw(source_slots, {}, 1);
  std::vector<std::vector<float>> ones;
  std::vector<const float*> grads;
  for (const auto& slot : source_slots) ones.emplace_back(size_t(slot.param.numel()), 1.0f);
  for (const auto& g : ones) grads.push_back(g.data());
  source_adamw.step(grads, 1e-3);
  TrainPosition pos;
  save_checkpoint(dir.file("other.safetensors"), other.to_json(), source.params(), &source_adamw, &pos);
  Checkpoint ckpt = load_checkpoint(dir.file("other.safetensors"));

  models::Vit model(small_vit(), 1);
  std::vector<optim::Slot> slots;
  for (const auto& [name, t] : model.params().list()) slots.push_back({name, t});
  optim::AdamW adamw(slots, {}, 1);
  const auto values = [](const std::vector<std::pair<std::string, Tensor>>& list) {
    std::vector<std::vector<float>> v;
    for (const auto& [name, t] : list) v.push_back(t.to_vector<float>());
    return v;
  };
  const auto params_before = values(model.params().list());
  const auto moments_before = values(adamw.state());
  EXPECT_NE(error_of<IoError>([&] { load_params(ckpt, model.params()); }).find("the model expects"),
            std::string::npos);
  EXPECT_NE(error_of<IoError>([&] { load_optimizer_state(ckpt, adamw); }).find("do not match"), std::string::npos);
  EXPECT_EQ(values(model.params().list()), params_before);
  EXPECT_EQ(values(adamw.state()), moments_before);
  EXPECT_EQ(adamw.steps(), 0);
}

TEST(WriteFileAtomic, RemovesTemporariesOfKilledWriters) {
  TempDir dir;
  const std::string path = dir.file("ck.safetensors");
  // A pid that cannot be running (above the kernel's limit), one that is (ours),
  // and a file that only looks similar.
  const std::string ours = "ck.safetensors.tmp-" + std::to_string(::getpid()) + "-99";
  for (const std::string& name : std::vector<std::string>{"ck.safetensors.tmp-2147483646-0", ours,
                                                          "ck.safetensors.tmp-notapid",
                                                          "other.safetensors.tmp-2147483646-0"}) {
    std::ofstream(dir.file(name)) << "partial";
  }
  write_file_atomic(path, "new");
  EXPECT_FALSE(fs::exists(dir.file("ck.safetensors.tmp-2147483646-0")));
  EXPECT_TRUE(fs::exists(dir.file(ours)));
  EXPECT_TRUE(fs::exists(dir.file("ck.safetensors.tmp-notapid")));
  EXPECT_TRUE(fs::exists(dir.file("other.safetensors.tmp-2147483646-0")));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "new");
}

// A file written in pieces: the old file stays until commit(); abandoned (an
// exception on the way) it leaves the old file and no temporary.
TEST(WriteFileAtomic, PiecesReplaceTheFileOnlyOnCommit) {
  TempDir dir;
  const std::string path = dir.file("model.gguf");
  write_file_atomic(path, "old");
  const auto text = [&] {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const auto files = [&] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++n;
    return n;
  };
  try {
    AtomicFile f(path);
    f.write("abc");
    throw IoError("a failure while writing");
  } catch (const IoError&) {
  }
  EXPECT_EQ(text(), "old");
  EXPECT_EQ(files(), 1u);
  {
    AtomicFile f(path);
    f.write("abc");
    f.pad_to(8);
    EXPECT_EQ(f.written(), 8u);
    f.pad_to(8);
    EXPECT_EQ(f.written(), 8u);
    f.write(std::string(300, 'x'));
    f.pad_to(256);
    EXPECT_EQ(f.written(), 512u);
    EXPECT_EQ(text(), "old");
    f.commit();
    EXPECT_THROW(f.write("late"), UsageError);
    EXPECT_THROW(f.commit(), UsageError);
  }
  EXPECT_EQ(text(), std::string("abc") + std::string(5, '\0') + std::string(300, 'x') + std::string(204, '\0'));
  EXPECT_EQ(files(), 1u);
}

TEST(ShapeLimits, ShapesTooLargeToDescribeAreShapeErrors) {
  // numel of these would overflow int64: refused before anything is computed or allocated.
  EXPECT_THROW(Tensor::zeros(DType::f32, {int64_t(1) << 32, int64_t(1) << 32}), ShapeError);
  EXPECT_THROW(Tensor::zeros(DType::f64, {int64_t(1) << 60}), ShapeError);
  EXPECT_THROW(Tensor::zeros(DType::f32, {3, -1}), ShapeError);
  EXPECT_NO_THROW(Tensor::zeros(DType::f32, {0, int64_t(1) << 40}));  // empty: no bytes
  EXPECT_THROW(Tensor::zeros(DType::f32, {0, int64_t(1) << 62, 4}), ShapeError);  // strides would overflow
  Tensor x = Tensor::zeros(DType::f32, {1, 2});
  EXPECT_THROW(expand(x, {int64_t(1) << 40, int64_t(1) << 40, 2}), ShapeError);
  EXPECT_THROW(expand(x, {-3, 2}), ShapeError);
  EXPECT_THROW(reshape(x, {int64_t(1) << 62, int64_t(1) << 62, -1}), ShapeError);
  EXPECT_THROW(scatter_slice(x, {int64_t(1) << 62, 2, 4}, 0, 0, 1, 1), ShapeError);
}

TEST(Idx, GzipInflatingBeyondTheHeaderIsRefusedWithoutKeepingIt) {
  TempDir dir;
  // A header claiming 10 bytes, then 64 MiB of zeros (64 KiB compressed).
  const std::string path = dir.file("bomb-idx1-ubyte.gz");
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  const char header[] = {0, 0, 8, 1, 0, 0, 0, 10};
  ASSERT_EQ(gzwrite(f, header, sizeof header), int(sizeof header));
  const std::string zeros(1 << 20, '\0');
  for (int i = 0; i < 64; ++i) ASSERT_EQ(gzwrite(f, zeros.data(), unsigned(zeros.size())), int(zeros.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
  std::string m = error_of<IoError>([&] { read_idx(path); });
  EXPECT_NE(m.find(path + ": IDX shape [10] needs 10 bytes of data, the file has 67108864"), std::string::npos) << m;
}
