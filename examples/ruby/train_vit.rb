#!/usr/bin/env ruby
# Trains a Vision Transformer on Fashion-MNIST from Ruby, through nabla's C
# API (examples/ruby/nabla.rb over ruby-ffi): a conv_2d patch embedding, a
# class token, LayerNorm, fused multi-head attention and an exact-GELU MLP,
# the model that ggml's auto-backward cannot train, so that FFI frameworks
# on it swap in RMSNorm, SiLU and a matmul. Here it is the real one, with
# timm's structure.
#
# Usage: train_vit.rb [--lib build/libnabla.so] [--steps 600] [--batch 64]
#                     [--threads 0] [--replicas 1] [--min-accuracy A]
#                     [--save vit.safetensors] [--logits FILE] [--gradient-checkpointing]
#                     [--job [--shard-optimizer]] [--max-steps N] [--checkpoint FILE] [--resume FILE]
# Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
# Prints the loss as it trains and the accuracy on the first 1,984 test
# images; with --min-accuracy, exits 1 below it. --replicas R builds the
# graph for batch / R images and trains R data-parallel copies of it, one
# per thread, each given its share of every batch. --save writes the weights
# with timm's names and layouts (a Linear's weight is [out, in]), which load
# into timm's VisionTransformer(img_size=28, patch_size=7, in_chans=1,
# embed_dim=64, depth=2, num_heads=4, mlp_ratio=2, num_classes=10) on inputs
# normalised as below; --logits writes those test images' logits (f32, raw).
# --gradient-checkpointing recomputes each block in the backward
# (nabla_recompute_begin/end): the same training in less memory.
# --job trains over the processes mpirun started (nabla_job_*): each runs
# --replicas replicas on its share of every batch and of the test images,
#   mpirun -np 2 ruby examples/ruby/train_vit.rb --job
# and the result is the one process with 2 x --replicas replicas gives, bit
# for bit; --shard-optimizer splits the AdamW moments among them. Rank 0
# prints and saves. --checkpoint writes the trainer's state at the end
# (weights, AdamW moments, step count), from which --resume continues the
# same schedule as if never stopped; --max-steps stops early.
require "optparse"
require "zlib"
require_relative "nabla"

opts = { lib: File.expand_path("../../build/libnabla.so", __dir__), steps: 600, batch: 64, threads: 0,
         replicas: 1, lr: 2e-3, data: "/usr/share/datasets/fashion-mnist", min_accuracy: nil }
OptionParser.new do |o|
  o.on("--lib PATH") { |v| opts[:lib] = v }
  o.on("--steps N", Integer) { |v| opts[:steps] = v }
  o.on("--batch N", Integer) { |v| opts[:batch] = v }
  o.on("--threads N", Integer) { |v| opts[:threads] = v }
  o.on("--replicas N", Integer) { |v| opts[:replicas] = v }
  o.on("--lr X", Float) { |v| opts[:lr] = v }
  o.on("--data DIR") { |v| opts[:data] = v }
  o.on("--min-accuracy A", Float) { |v| opts[:min_accuracy] = v }
  o.on("--save PATH") { |v| opts[:save] = v }
  o.on("--logits PATH") { |v| opts[:logits] = v }
  o.on("--gradient-checkpointing") { opts[:checkpointing] = true }
  o.on("--job") { opts[:job] = true }
  o.on("--max-steps N", Integer) { |v| opts[:max_steps] = v }
  o.on("--checkpoint PATH") { |v| opts[:checkpoint] = v }
  o.on("--resume PATH") { |v| opts[:resume] = v }
  o.on("--shard-optimizer") { opts[:shard] = true }
end.parse!
Nabla.load(opts[:lib])
job = opts[:job] ? Nabla::Job.new : nil
RANK, PROCESSES = job ? [job.rank, job.size] : [0, 1]
say = ->(line) { puts line if RANK.zero? }
abort "train_vit.rb: --logits writes one process's evaluation; not with --job" if job && opts[:logits]

# IDX files: a magic number, the dimensions (big-endian u32), then u8s.
def read_idx(path)
  bytes = Zlib::GzipReader.open(path, &:read)
  rank = bytes.getbyte(3)
  dims = bytes[4, 4 * rank].unpack("N*")
  [bytes.byteslice(4 + 4 * rank, dims.reduce(:*)), dims]
end

train_x, train_dims = read_idx(File.join(opts[:data], "train-images-idx3-ubyte.gz"))
train_y = read_idx(File.join(opts[:data], "train-labels-idx1-ubyte.gz"))[0].unpack("C*")
test_x, = read_idx(File.join(opts[:data], "t10k-images-idx3-ubyte.gz"))
test_y = read_idx(File.join(opts[:data], "t10k-labels-idx1-ubyte.gz"))[0].unpack("C*")
PIXELS = train_dims[1] * train_dims[2]

# The fmnist preset's shape, smaller: patch 7 (16 tokens and a class token),
# width 64, 4 heads, depth 2, MLP 128.
# B: the graph's batch, each replica's share of the training batch (of
# every process's replicas).
REPLICAS = opts[:replicas]
if opts[:batch] % (REPLICAS * PROCESSES) != 0
  abort "train_vit.rb: #{PROCESSES} process(es) x --replicas #{REPLICAS} do not divide --batch #{opts[:batch]}"
end
B, S, PATCH, E, HEADS, DEPTH, MLP, CLASSES = opts[:batch] / (REPLICAS * PROCESSES), 28, 7, 64, 4, 2, 128, 10
T = (S / PATCH)**2 + 1
rng = Random.new(1)
ctx = Nabla::Context.new
# Truncated normal, std 0.02, as timm initialises ViT weights.
init = lambda do |shape, std: 0.02|
  Array.new(shape.reduce(:*)) do
    z = 3.0
    z = Math.sqrt(-2 * Math.log(1 - rng.rand)) * Math.cos(2 * Math::PI * rng.rand) while z.abs > 2
    std * z
  end
end
# Parameters under timm's names, in the order of its state dict.
named = []
param = lambda do |name, shape, values|
  ctx.parameter(shape, values).tap { |t| named << [name, t] }
end
normal = ->(name, shape) { param.call(name, shape, init.call(shape)) }
zeros = ->(name, shape) { param.call(name, shape, Array.new(shape.reduce(:*), 0.0)) }
ones = ->(name, shape) { param.call(name, shape, Array.new(shape.reduce(:*), 1.0)) }
# A Linear as PyTorch stores it: weight [out, in], read transposed (a view).
linear = lambda do |x, name, i, o|
  w = ctx.op(:transpose, normal.call("#{name}.weight", [o, i]), 0, 1)
  ctx.op(:matmul_add, x, w, zeros.call("#{name}.bias", [o]))
end
norm = ->(x, name) { ctx.op(:layer_norm, x, ones.call("#{name}.weight", [E]), zeros.call("#{name}.bias", [E]), 1e-6) }

images = ctx.tensor([B, 1, S, S])
labels = ctx.tensor([B], dtype: Nabla::I32)
# Pixels arrive as 0..255; normalise with Fashion-MNIST's mean and std.
mean = ctx.tensor([1], [-0.2860 / 0.3530])
x = ctx.op(:add, ctx.op(:scale, images, 1.0 / (255 * 0.3530)), mean)
cls = zeros.call("cls_token", [1, 1, E])
pos = normal.call("pos_embed", [1, T, E])
x = ctx.op(:conv_2d, x, normal.call("patch_embed.proj.weight", [E, 1, PATCH, PATCH]),
           zeros.call("patch_embed.proj.bias", [E]), [PATCH, PATCH], nil, nil, 1)
x = ctx.op(:transpose, ctx.op(:reshape, x, 3, [B, E, T - 1]), 1, 2)
x = ctx.op(:concat, Nabla.pointers([ctx.op(:expand, cls, 3, [B, 1, E]).ptr, x.ptr]), 2, 1)
x = ctx.op(:add, x, pos)
vit_block = lambda do |x, block|
  qkv = ctx.op(:reshape, linear.call(norm.call(x, "#{block}.norm1"), "#{block}.attn.qkv", E, 3 * E), 5,
               [B, T, 3, HEADS, E / HEADS])
  q, k, v = (0..2).map { |j| ctx.op(:reshape, ctx.op(:slice, qkv, 2, j, j + 1, 1), 4, [B, T, HEADS, E / HEADS]) }
  attended = ctx.op(:reshape, ctx.op(:attention, q, k, v, 0, 0.0), 3, [B, T, E])
  x = ctx.op(:add, x, linear.call(attended, "#{block}.attn.proj", E, E))
  hidden = ctx.op(:gelu_erf, linear.call(norm.call(x, "#{block}.norm2"), "#{block}.mlp.fc1", E, MLP))
  ctx.op(:add, x, linear.call(hidden, "#{block}.mlp.fc2", MLP, E))
end
# With --gradient-checkpointing each block is recomputed in the backward.
DEPTH.times do |i|
  x = opts[:checkpointing] ? ctx.recompute { vit_block.call(x, "blocks.#{i}") } : vit_block.call(x, "blocks.#{i}")
end
x = ctx.op(:reshape, ctx.op(:slice, norm.call(x, "norm"), 1, 0, 1, 1), 2, [B, E])
logits = linear.call(x, "head", E, CLASSES)
loss = ctx.op(:cross_entropy, logits, labels, -100)

trainer = Nabla::Trainer.new(ctx, loss, no_decay: [cls, pos], threads: opts[:threads], replicas: REPLICAS, job: job,
                                        shard_optimizer: opts[:shard])
count, elements = trainer.parameters
say.call "ViT from Ruby: #{count} parameter tensors, #{elements} values; batch #{opts[:batch]} " \
         "(#{PROCESSES} process(es) x #{REPLICAS} replica(s) of #{B}), #{opts[:steps]} steps" \
         "#{job ? "; #{job.description}" : ''}"

order = (0...train_y.size).to_a.shuffle(random: rng)
# Each replica's images and labels (replica 0's are the graph's own).
inputs = (0...REPLICAS).map { |r| [trainer.replica(r, images), trainer.replica(r, labels)] }
batch_of = lambda do |pixels, ys, indices, into: [[images, labels]]|
  indices.each_slice(B).zip(into) do |share, (imgs, lbls)|
    ctx.write(imgs, share.flat_map { |i| pixels.byteslice(i * PIXELS, PIXELS).unpack("C*") })
    ctx.write(lbls, share.map { |i| ys[i] })
  end
end
trainer.load(opts[:resume]) if opts[:resume]
first_step = trainer.steps
started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
warmup = [opts[:steps] / 10, 1].max
last_step = [opts[:steps], opts[:max_steps] || opts[:steps]].min
(first_step...last_step).each do |step|
  # This process's replicas take shares RANK * REPLICAS, ... of the batch.
  mine = order.rotate(step * opts[:batch]).first(opts[:batch]).each_slice(B).drop(RANK * REPLICAS).first(REPLICAS)
  batch_of.call(train_x, train_y, mine.flatten, into: inputs)
  # Linear warmup, then cosine decay to 0.
  lr = if step < warmup
         opts[:lr] * (step + 1) / warmup
       else
         0.5 * opts[:lr] * (1 + Math.cos(Math::PI * (step - warmup) / (opts[:steps] - warmup)))
       end
  value = trainer.run
  grad_norm = trainer.update(lr, clip: 1.0)
  if (step % 100).zero? || step == last_step - 1
    say.call format("step %4d  loss %.4f  grad norm %.3f  lr %.2e", step, value, grad_norm, lr)
  end
end
elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
trainer.save(opts[:checkpoint]) if opts[:checkpoint]

# Evaluation through nabla_compute on the same graph: the parameters are the
# leaves the trainer updated in place. Each process takes every PROCESSES-th
# batch of test images; their counts are summed over the job.
argmax = ctx.op(:argmax, logits, 1, 0)
correct = 0
tested = (2000 / B) * B
all_logits = []
(0...tested).each_slice(B).each_with_index do |indices, k|
  next unless k % PROCESSES == RANK
  batch_of.call(test_x, test_y, indices)
  ctx.compute([argmax, logits], threads: opts[:threads])
  correct += ctx.read(argmax).zip(indices).count { |pred, i| pred == test_y[i] }
  all_logits.concat(ctx.read(logits)) if opts[:logits]
end
correct = job.sum([correct])[0].to_i if job
ctx.save(opts[:save], named) if opts[:save] && RANK.zero?
File.binwrite(opts[:logits], all_logits.pack("e*")) if opts[:logits]
accuracy = correct.to_f / tested
say.call format("test accuracy %.2f%% on %d images after %.1f s of training (%.0f images/s, data prep in Ruby included)",
            100 * accuracy, tested, elapsed, (last_step - first_step) * opts[:batch] / elapsed)
if opts[:min_accuracy] && accuracy < opts[:min_accuracy]
  warn format("train_vit.rb: accuracy %.4f is below --min-accuracy %.4f", accuracy, opts[:min_accuracy])
  exit 1
end
