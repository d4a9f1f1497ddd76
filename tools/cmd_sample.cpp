// `nabla sample`: text from a GPT-2 checkpoint. One compiled decoding step
// with a key/value cache: each new token costs one position's work, never
// the whole prefix again.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "commands.h"
#include "nabla/models/gpt2.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/tokenizer.h"

namespace nabla::cli {

namespace {

// Softmax of logits / temperature over the top k, then one draw.
int32_t sample_token(const std::vector<float>& logits, double temperature, int top_k, std::mt19937_64& rng) {
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
  size_t k = top_k > 0 ? std::min<size_t>(size_t(top_k), idx.size()) : idx.size();
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (temperature <= 0) return idx[0];
  std::vector<double> w(k);
  for (size_t i = 0; i < k; ++i) w[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / temperature);
  std::discrete_distribution<size_t> pick(w.begin(), w.end());
  return idx[pick(rng)];
}

}  // namespace

int run_sample(const SampleArgs& a) {
  Checkpoint ckpt = load_checkpoint(a.checkpoint);
  models::Gpt2Config cfg = models::gpt2_config_from_checkpoint(ckpt);
  models::Gpt2 model(cfg, 0);
  load_params(ckpt, model.params());
  std::unique_ptr<Tokenizer> tok = make_tokenizer(cfg.tokenizer, a.vocab);

  std::vector<int32_t> ids = tok->encode(a.prompt);
  if (ids.empty()) ids.push_back(tok->eot_id() >= 0 ? tok->eot_id() : int32_t('\n'));
  int64_t max_len = std::min<int64_t>(cfg.n_positions, int64_t(ids.size()) + a.tokens);
  if (int64_t(ids.size()) >= max_len) {
    throw UsageError(fmt::format("sample: the prompt's {} tokens fill the context of {}", ids.size(), cfg.n_positions));
  }
  models::Gpt2::DecodeStep s = model.decode_step(max_len);
  Graph g({s.logits});
  for (size_t l = 0; l < s.k_new.size(); ++l) {
    g.add_output(s.k_new[l]);
    g.add_output(s.v_new[l]);
  }
  Executor ex(g, {.threads = a.threads});
  const int64_t H = cfg.n_head, hd = cfg.n_embd / cfg.n_head;
  std::mt19937_64 rng(a.seed);

  fmt::print("{}", a.prompt);
  std::fflush(stdout);
  std::vector<float> kv(size_t(H * hd));
  for (int64_t p = 0; p + 1 < max_len; ++p) {
    s.token.data_as<int32_t>()[0] = ids[p];
    s.position.data_as<int32_t>()[0] = int32_t(p);
    ex.run();
    // Append this position's keys and values to the caches.
    for (size_t l = 0; l < s.k_new.size(); ++l) {
      for (auto [fresh, cache] : {std::pair{s.k_new[l], s.k_cache[l]}, std::pair{s.v_new[l], s.v_cache[l]}}) {
        ex.read(fresh, kv.data(), kv.size() * sizeof(float));
        float* c = cache.data_as<float>();
        int64_t Tm = cache.dim(2);
        for (int64_t h = 0; h < H; ++h) std::copy_n(kv.data() + h * hd, hd, c + (h * Tm + p) * hd);
      }
    }
    s.mask.data_as<float>()[p] = 0;  // later positions may attend to p
    if (p + 1 < int64_t(ids.size())) continue;  // still reading the prompt
    int32_t next = sample_token(ex.read<float>(s.logits), a.temperature, a.top_k, rng);
    ids.push_back(next);
    fmt::print("{}", tok->decode(std::span<const int32_t>(&ids.back(), 1)));
    std::fflush(stdout);
  }
  fmt::print("\n");
  return kExitOk;
}

}  // namespace nabla::cli
