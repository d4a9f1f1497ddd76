#include "core/planner.h"

#include <algorithm>
#include <limits>
#include <map>

#include "core/node.h"
#include "core/op.h"

namespace nabla {

namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kForever = std::numeric_limits<int64_t>::max();

// Best-fit allocator over byte offsets; freed neighbours merge.
class ArenaAllocator {
 public:
  int64_t allocate(int64_t bytes) {
    bytes = std::max<int64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best != free_.end()) {
      int64_t off = best->first, size = best->second;
      free_.erase(best);
      if (size > bytes) free_[off + bytes] = size - bytes;
      sizes_[off] = bytes;
      return off;
    }
    // Grow: a free block that ends at the top is extended instead of wasted.
    int64_t off = top_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        off = last->first;
        free_.erase(last);
      }
    }
    top_ = off + bytes;
    sizes_[off] = bytes;
    return off;
  }

  void release(int64_t off) {
    int64_t size = sizes_.at(off);
    sizes_.erase(off);
    auto it = free_.emplace(off, size).first;
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }

  int64_t top() const { return top_; }

 private:
  std::map<int64_t, int64_t> free_;   // offset -> size
  std::map<int64_t, int64_t> sizes_;  // live allocations
  int64_t top_ = 0;
};

}  // namespace

MemoryPlan plan_memory(const std::vector<Tensor>& order, const std::vector<Tensor>& outputs, bool reuse,
                       bool inplace) {
  const int64_t n = static_cast<int64_t>(order.size());
  std::unordered_map<const Node*, int64_t> pos;
  for (int64_t i = 0; i < n; ++i) pos[order[i].node()] = i;
  auto root_pos = [&](const Tensor& t) { return pos.at(t.node()->root()); };
  auto computed = [&](int64_t i) { return !order[i].node()->is_leaf() && !order[i].node()->is_view(); };

  // last_use[r]: the last step that reads root r's memory, through any view.
  std::vector<int64_t> last_use(n);
  for (int64_t i = 0; i < n; ++i) last_use[i] = i;
  for (int64_t i = 0; i < n; ++i) {
    const Node* node = order[i].node();
    if (node->is_view()) continue;  // a view reads nothing itself; its readers count
    for (const Tensor& in : node->inputs) {
      int64_t r = root_pos(in);
      last_use[r] = std::max(last_use[r], i);
    }
  }
  for (const Tensor& out : outputs) last_use[root_pos(out)] = kForever;
  if (!reuse) std::fill(last_use.begin(), last_use.end(), kForever);

  std::vector<std::vector<int64_t>> dying_at(n);
  for (int64_t r = 0; r < n; ++r) {
    if (computed(r) && last_use[r] != kForever) dying_at[last_use[r]].push_back(r);
  }

  MemoryPlan plan;
  plan.offset.assign(n, -1);
  // An allocation is freed by its holder's death; running in place hands the
  // donor's allocation to the new node.
  std::vector<int64_t> alloc_of(n, -1), holder;
  ArenaAllocator arena;
  for (int64_t i = 0; i < n; ++i) {
    if (!computed(i)) continue;
    const Node* node = order[i].node();
    int64_t bytes = node->numel() * static_cast<int64_t>(dtype_size(node->dtype));
    plan.report.unplanned_bytes += static_cast<size_t>((bytes + kAlign - 1) / kAlign * kAlign);

    int64_t donor = -1;
    if (inplace && reuse && (node->op->elementwise || node->op->inplace_input >= 0)) {
      for (size_t k = 0; k < node->inputs.size() && donor < 0; ++k) {
        if (!node->op->elementwise && static_cast<int>(k) != node->op->inplace_input) continue;
        const Tensor& in = node->inputs[k];
        int64_t r = root_pos(in);
        bool candidate = covers_root(in) && computed(r) && last_use[r] == i && in.dtype() == node->dtype &&
                         in.shape() == node->shape;
        // Another operand reading the same memory at other positions would see
        // overwritten values.
        for (size_t j = 0; j < node->inputs.size() && candidate; ++j) {
          if (j != k && root_pos(node->inputs[j]) == r) candidate = false;
        }
        if (candidate) donor = r;
      }
    }
    if (donor >= 0) {
      alloc_of[i] = alloc_of[donor];
      holder[alloc_of[i]] = i;
      plan.offset[i] = plan.offset[donor];
      ++plan.report.inplace;
    } else {
      alloc_of[i] = static_cast<int64_t>(holder.size());
      holder.push_back(i);
      plan.offset[i] = arena.allocate(bytes);
      ++plan.report.buffers;
    }
    for (int64_t r : dying_at[i]) {
      if (holder[alloc_of[r]] == r) {
        arena.release(plan.offset[r]);
        holder[alloc_of[r]] = -1;
      }
    }
  }
  plan.report.arena_bytes = static_cast<size_t>(arena.top());
  return plan;
}

}  // namespace nabla
