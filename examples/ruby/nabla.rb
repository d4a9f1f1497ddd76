# A small Ruby binding of nabla's C API (include/nabla.h) over Debian's
# ruby-ffi: what a Ruby ML framework would write to train real models
# through nabla. Only the entry points the examples use are attached; each
# one is a line in SIGNATURES.
#
#   Nabla.load("build/libnabla.so")   # a build tree
#   Nabla.load                         # an installed libnabla.so.0 (cmake --install):
#                                      # found as the dynamic loader finds libraries
#                                      # (LD_LIBRARY_PATH, ldconfig's cache), or in /usr/local/lib
#   job = Nabla::Job.new                # under mpirun: this process's rank of the job
#   ctx = Nabla::Context.new
#   w = ctx.parameter([4, 3], values)          # f32 unless dtype: is given
#   y = ctx.op(:gelu_erf, ctx.op(:matmul, x, w))
#
# A failed call raises Nabla::Error with nabla's own message.
require "ffi"

module Nabla
  extend FFI::Library

  class Error < StandardError; end

  F32, F64, I32 = 0, 1, 2
  TRAIN_BF16_MATMUL, TRAIN_LOW_MEMORY, TRAIN_JOB, TRAIN_SHARD_OPTIMIZER = 1, 2, 4, 8

  P = :pointer
  SIGNATURES = {
    nabla_last_error: [[], :string],
    nabla_context_create: [[P], :int],
    nabla_context_free: [[P], :void],
    nabla_context_set_backend: [[P, :string], :int],
    nabla_tensor_from_data: [[P, :int, :int, P, P, P], :int],
    nabla_parameter: [[P, :int, :int, P, P, P], :int],
    nabla_tensor_write: [[P, P, P, :size_t], :int],
    nabla_tensor_read: [[P, P, P, :size_t], :int],
    nabla_tensor_rank: [[P, P], :int],
    nabla_tensor_shape: [[P, P, :int], :int],
    nabla_tensor_dtype: [[P, P], :int],
    nabla_add: [[P, P, P, P], :int],
    nabla_mul: [[P, P, P, P], :int],
    nabla_matmul_add: [[P, P, P, P, P], :int],
    nabla_scale: [[P, P, :double, P], :int],
    nabla_gelu_erf: [[P, P, P], :int],
    nabla_reshape: [[P, P, :int, P, P], :int],
    nabla_expand: [[P, P, :int, P, P], :int],
    nabla_transpose: [[P, P, :int64, :int64, P], :int],
    nabla_slice: [[P, P, :int64, :int64, :int64, :int64, P], :int],
    nabla_concat: [[P, P, :size_t, :int64, P], :int],
    nabla_layer_norm: [[P, P, P, P, :double, P], :int],
    nabla_attention: [[P, P, P, P, :int, :double, P], :int],
    nabla_attention_within: [[P, P, P, P, :int, :double, P, :int64, P], :int],
    nabla_attention_capped: [[P, P, P, P, :int, :double, P, :int64, :double, P], :int],
    nabla_rope: [[P, P, :int64, :double, :int, P], :int],
    nabla_rope_at: [[P, P, P, :int64, :double, :int, P, :int64, :int64, :double, P], :int],
    nabla_conv_2d: [[P, P, P, P, P, P, P, :int64, P], :int],
    nabla_cross_entropy: [[P, P, P, :int64, P], :int],
    nabla_argmax: [[P, P, :int64, :int, P], :int],
    nabla_compute: [[P, P, :size_t, :int], :int],
    nabla_recompute_begin: [[P, P], :int],
    nabla_recompute_end: [[P, :uint64, P], :int],
    nabla_save_safetensors: [[P, :string, P, P, :size_t], :int],
    nabla_load_safetensors: [[P, :string, P, P, :size_t], :int],
    nabla_trainer_create: [[P, P, P, :size_t, :double, :double, :double, :double, P, :size_t, :int, :int, P], :int],
    nabla_trainer_run: [[P, P], :int],
    nabla_trainer_update: [[P, :double, :double, P], :int],
    nabla_trainer_read: [[P, P, P, :size_t], :int],
    nabla_trainer_parameters: [[P, P, P, P], :int],
    nabla_trainer_replica: [[P, :int, P, P], :int],
    nabla_trainer_save: [[P, :string, P], :int],
    nabla_trainer_load: [[P, :string, P], :int],
    nabla_trainer_steps: [[P, P], :int],
    nabla_finetune_create: [[:string, :string, :int64, :double, :double, :int, :string, :int64, :int64, :double,
                             :int, :uint64, P], :int],
    nabla_finetune_shape: [[P, P, P, P, P], :int],
    nabla_finetune_encode: [[P, :string, P, :int64, P], :int],
    nabla_finetune_encode_example: [[P, :string, :string, P, P, :int64, P], :int],
    nabla_finetune_encode_prompt: [[P, :string, :string, P, :int64, P], :int],
    nabla_finetune_generate: [[P, P, :int64, :int64, :double, :int64, :double, :uint64, :int, P, P, P], :int],
    nabla_finetune_decode: [[P, P, :int64, P, :int64, P], :int],
    nabla_finetune_step: [[P, P, P, P, :double, :double, P], :int],
    nabla_finetune_save: [[P, :string], :int],
    nabla_finetune_save_gguf: [[P, :string], :int],
    nabla_finetune_free: [[P], :void],
    nabla_job_join: [[P], :int],
    nabla_job_rank: [[P, P, P], :int],
    nabla_job_describe: [[P, P], :int],
    nabla_job_sum: [[P, P, :size_t], :int],
    nabla_job_barrier: [[P], :int],
    nabla_job_free: [[P], :void]
  }.freeze

  # path: a file, or a list of names to try in turn.
  def self.load(path = ["libnabla.so.0", "nabla"])
    ffi_lib path
    SIGNATURES.each { |name, (args, ret)| attach_function name, args, ret }
  end

  def self.check(status)
    raise Error, "#{nabla_last_error} (status #{status})" unless status.zero?
  end

  def self.int64s(values)
    FFI::MemoryPointer.new(:int64, [values.size, 1].max).tap { |m| m.write_array_of_int64(values) }
  end

  def self.pointers(values)
    FFI::MemoryPointer.new(:pointer, [values.size, 1].max).tap { |m| m.write_array_of_pointer(values) }
  end

  # Element type and FFI pack code per dtype.
  PACK = { F32 => ["e*", 4], F64 => ["E*", 8], I32 => ["l<*", 4] }.freeze

  # A tensor handle: its context owns it.
  Tensor = Struct.new(:ptr, :shape, :dtype) do
    def numel = shape.reduce(1, :*)
  end

  class Context
    def initialize
      out = FFI::MemoryPointer.new(:pointer)
      Nabla.check(Nabla.nabla_context_create(out))
      @ctx = out.read_pointer
      ObjectSpace.define_finalizer(self, Context.release(@ctx))
    end

    def self.release(ctx) = proc { Nabla.nabla_context_free(ctx) }

    attr_reader :ctx

    def tensor(shape, values = nil, dtype: F32) = leaf(:nabla_tensor_from_data, shape, values, dtype)
    def parameter(shape, values, dtype: F32) = leaf(:nabla_parameter, shape, values, dtype)

    # nabla_<name>(ctx, *args, &out): Tensors go as handles, Arrays of
    # integers as int64 arrays, nil as NULL.
    def op(name, *args)
      out = FFI::MemoryPointer.new(:pointer)
      args = args.map do |a|
        case a
        when Tensor then a.ptr
        when Array then Nabla.int64s(a)
        else a
        end
      end
      Nabla.check(Nabla.send(:"nabla_#{name}", @ctx, *args, out))
      wrap(out.read_pointer)
    end

    def write(t, values)
      bytes = values.pack(PACK.fetch(t.dtype)[0])
      Nabla.check(Nabla.nabla_tensor_write(@ctx, t.ptr, FFI::MemoryPointer.from_string(bytes), bytes.bytesize))
    end

    def read(t)
      code, size = PACK.fetch(t.dtype)
      buf = FFI::MemoryPointer.new(:char, [t.numel * size, 1].max)
      Nabla.check(Nabla.nabla_tensor_read(@ctx, t.ptr, buf, t.numel * size))
      buf.read_bytes(t.numel * size).unpack(code)
    end

    # Gradient checkpointing: the ops the block builds, which its result (a
    # Tensor) depends on, are recomputed in the backward instead of kept.
    def recompute
      mark = FFI::MemoryPointer.new(:uint64)
      Nabla.check(Nabla.nabla_recompute_begin(@ctx, mark))
      yield.tap { |out| Nabla.check(Nabla.nabla_recompute_end(@ctx, mark.read_uint64, out.ptr)) }
    end

    def compute(outputs, threads: 0)
      Nabla.check(Nabla.nabla_compute(@ctx, Nabla.pointers(outputs.map(&:ptr)), outputs.size, threads))
    end

    # Checkpoints: [[name, tensor], ...] to and from a safetensors file.
    def save(path, named) = safetensors(:nabla_save_safetensors, path, named)
    def load(path, named) = safetensors(:nabla_load_safetensors, path, named)

    def wrap(ptr)
      rank = FFI::MemoryPointer.new(:int)
      Nabla.check(Nabla.nabla_tensor_rank(ptr, rank))
      dims = FFI::MemoryPointer.new(:int64, [rank.read_int, 1].max)
      Nabla.check(Nabla.nabla_tensor_shape(ptr, dims, rank.read_int))
      dtype = FFI::MemoryPointer.new(:int)
      Nabla.check(Nabla.nabla_tensor_dtype(ptr, dtype))
      Tensor.new(ptr, dims.read_array_of_int64(rank.read_int), dtype.read_int)
    end

    private

    def safetensors(fn, path, named)
      names = named.map { |name, _| FFI::MemoryPointer.from_string(name) }
      Nabla.check(Nabla.send(fn, @ctx, path, Nabla.pointers(names), Nabla.pointers(named.map { |_, t| t.ptr }),
                             named.size))
    end

    def leaf(fn, shape, values, dtype)
      data = nil
      if values
        bytes = values.pack(PACK.fetch(dtype)[0])
        data = FFI::MemoryPointer.from_string(bytes)
      end
      out = FFI::MemoryPointer.new(:pointer)
      Nabla.check(Nabla.send(fn, @ctx, dtype, shape.size, Nabla.int64s(shape), data, out))
      Tensor.new(out.read_pointer, shape.dup, dtype)
    end
  end

  # The job a launcher (mpirun) started this process in, joined
  # (nabla_job_*): a Trainer or Finetune given it runs each step over every
  # process. A process started alone is a job of one.
  class Job
    attr_reader :rank, :size, :description

    def initialize
      out = FFI::MemoryPointer.new(:pointer)
      Nabla.check(Nabla.nabla_job_join(out))
      @job = out.read_pointer
      ObjectSpace.define_finalizer(self, Job.release(@job))
      rank, size, text = FFI::MemoryPointer.new(:int), FFI::MemoryPointer.new(:int), FFI::MemoryPointer.new(:pointer)
      Nabla.check(Nabla.nabla_job_rank(@job, rank, size))
      Nabla.check(Nabla.nabla_job_describe(@job, text))
      @rank, @size, @description = rank.read_int, size.read_int, text.read_pointer.read_string
    end

    def self.release(job) = proc { Nabla.nabla_job_free(job) }

    # Every process's values (numbers) summed in rank order, on every process.
    def sum(values)
      buf = FFI::MemoryPointer.new(:double, [values.size, 1].max)
      buf.write_array_of_double(values)
      Nabla.check(Nabla.nabla_job_sum(@job, buf, values.size))
      buf.read_array_of_double(values.size)
    end

    def barrier = Nabla.check(Nabla.nabla_job_barrier(@job))
  end

  # A pretrained Llama-family model (HF folder, GGUF, checkpoint) with LoRA
  # adapters on its frozen weights (nabla_finetune_*): token batches in,
  # adapters out as a PEFT folder and a llama.cpp GGUF.
  class Finetune
    attr_reader :batch, :context, :vocab, :trained

    # lora_r 0: full fine-tuning; lora_targets: "q_proj,v_proj" (nil: all seven).
    # A GGUF or BF16 base stays in its storage type (QLoRA) unless dequantize_base.
    # batch: the step's rows, split among `replicas` (one per thread) and a
    # job's processes (each passes #batch rows to #step).
    def initialize(base, adapter: nil, lora_r: 8, lora_alpha: 16.0, lora_dropout: 0.0, rslora: false,
                   lora_targets: nil, batch: 4, context: 0, weight_decay: 0.0, threads: 0, seed: 1,
                   gradient_checkpointing: false, dequantize_base: false, replicas: 1, job: nil,
                   shard_optimizer: false, dora: false)
      out = FFI::MemoryPointer.new(:pointer)
      flags = (rslora ? 1 : 0) | (gradient_checkpointing ? 2 : 0) | (dequantize_base ? 4 : 0) |
              (job ? 8 : 0) | (shard_optimizer ? 16 : 0) | (dora ? 32 : 0) | (replicas << 8) # NABLA_FINETUNE_*
      Nabla.check(Nabla.nabla_finetune_create(base, adapter, lora_r, lora_alpha, lora_dropout, flags,
                                              lora_targets, batch, context, weight_decay, threads, seed, out))
      @ft = out.read_pointer
      ObjectSpace.define_finalizer(self, Finetune.release(@ft))
      dims = Array.new(4) { FFI::MemoryPointer.new(:int64) }
      Nabla.check(Nabla.nabla_finetune_shape(@ft, *dims))
      @batch, @context, @vocab, @trained = dims.map(&:read_int64)
    end

    def self.release(ft) = proc { Nabla.nabla_finetune_free(ft) }

    # The base's token ids for text.
    def encode(text)
      count = FFI::MemoryPointer.new(:int64)
      Nabla.check(Nabla.nabla_finetune_encode(@ft, text, nil, 0, count))
      ids = FFI::MemoryPointer.new(:int32, [count.read_int64, 1].max)
      Nabla.check(Nabla.nabla_finetune_encode(@ft, text, ids, count.read_int64, count))
      ids.read_array_of_int32(count.read_int64)
    end

    # One line of `nabla finetune --data` ({"text"}, {"prompt", "completion"}
    # or {"messages"}) as [ids, labels], as nabla finetune makes them;
    # messages in chat_template (nil: the base's own).
    def example(line, chat_template: nil)
      count = FFI::MemoryPointer.new(:int64)
      Nabla.check(Nabla.nabla_finetune_encode_example(@ft, line, chat_template, nil, nil, 0, count))
      n = count.read_int64
      ids, labels = Array.new(2) { FFI::MemoryPointer.new(:int32, [n, 1].max) }
      Nabla.check(Nabla.nabla_finetune_encode_example(@ft, line, chat_template, ids, labels, n, count))
      [ids.read_array_of_int32(n), labels.read_array_of_int32(n)]
    end

    # What a line's reply is generated from, as ids: {"prompt"}, {"text"}, or
    # {"messages"} less a last assistant message, then the assistant's header.
    def prompt(line, chat_template: nil)
      count = FFI::MemoryPointer.new(:int64)
      Nabla.check(Nabla.nabla_finetune_encode_prompt(@ft, line, chat_template, nil, 0, count))
      ids = FFI::MemoryPointer.new(:int32, [count.read_int64, 1].max)
      Nabla.check(Nabla.nabla_finetune_encode_prompt(@ft, line, chat_template, ids, count.read_int64, count))
      ids.read_array_of_int32(count.read_int64)
    end

    # The model as trained so far continues prompt_ids: up to max_tokens new
    # ids, stopping at the end of text or of a chat turn unless ignore_eos
    # (temperature 0: greedy). With logprobs: [ids, their log-probabilities].
    def generate(prompt_ids, max_tokens: 64, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1, ignore_eos: false,
                 logprobs: false)
      prompt = FFI::MemoryPointer.new(:int32, [prompt_ids.size, 1].max).tap { |m| m.write_array_of_int32(prompt_ids) }
      out = FFI::MemoryPointer.new(:int32, max_tokens)
      lp = logprobs ? FFI::MemoryPointer.new(:float, max_tokens) : nil
      count = FFI::MemoryPointer.new(:int64)
      Nabla.check(Nabla.nabla_finetune_generate(@ft, prompt, prompt_ids.size, max_tokens, temperature, top_k, top_p,
                                                seed, ignore_eos ? 1 : 0, out, lp, count)) # NABLA_GENERATE_IGNORE_EOS
      ids = out.read_array_of_int32(count.read_int64)
      logprobs ? [ids, lp.read_array_of_float(ids.size)] : ids
    end

    # Token ids as text in the base's tokenizer.
    def decode(ids)
      buf = FFI::MemoryPointer.new(:int32, [ids.size, 1].max).tap { |m| m.write_array_of_int32(ids) }
      length = FFI::MemoryPointer.new(:int64)
      Nabla.check(Nabla.nabla_finetune_decode(@ft, buf, ids.size, nil, 0, length))
      text = FFI::MemoryPointer.new(:char, length.read_int64 + 1)
      Nabla.check(Nabla.nabla_finetune_decode(@ft, buf, ids.size, text, length.read_int64 + 1, length))
      text.read_bytes(length.read_int64).force_encoding(Encoding::UTF_8)
    end

    # The reply to a data line ({"prompt"} or {"messages"}), as text.
    def reply(line, chat_template: nil, **options) = decode(generate(prompt(line, chat_template: chat_template),
                                                                     **options))

    # One AdamW step on flat [batch * context] arrays; returns the loss.
    def step(input_ids, labels, lr:, clip: 1.0, segments: nil)
      int32s = ->(v) { v && FFI::MemoryPointer.new(:int32, v.size).tap { |m| m.write_array_of_int32(v) } }
      loss = FFI::MemoryPointer.new(:float)
      Nabla.check(Nabla.nabla_finetune_step(@ft, int32s[input_ids], int32s[labels], int32s[segments], lr, clip,
                                            loss))
      loss.read_float
    end

    def save(dir) = Nabla.check(Nabla.nabla_finetune_save(@ft, dir))
    def save_gguf(path) = Nabla.check(Nabla.nabla_finetune_save_gguf(@ft, path))
  end

  # Forward, backward and a fused AdamW step over every parameter the loss
  # reaches, compiled once (nabla_trainer_*). replicas: data-parallel copies
  # of the graph (each a share of the batch, one per thread), whose inputs
  # come from #replica. job: a Job, whose processes each run `replicas`
  # (process k's replica i is replica k * replicas + i of the step);
  # shard_optimizer: each holds its part of the AdamW moments alone.
  class Trainer
    def initialize(ctx, loss, extras: [], betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.05,
                   no_decay: [], threads: 0, flags: 0, replicas: 1, job: nil, shard_optimizer: false)
      @ctx = ctx
      out = FFI::MemoryPointer.new(:pointer)
      flags |= replicas << 8 # NABLA_TRAIN_REPLICAS(r)
      flags |= TRAIN_JOB if job
      flags |= TRAIN_SHARD_OPTIMIZER if shard_optimizer
      Nabla.check(Nabla.nabla_trainer_create(ctx.ctx, loss.ptr, Nabla.pointers(extras.map(&:ptr)), extras.size,
                                             betas[0], betas[1], eps, weight_decay,
                                             Nabla.pointers(no_decay.map(&:ptr)), no_decay.size,
                                             threads, flags, out))
      @trainer = out.read_pointer
    end

    # Replica i's copy of a tensor of the graph (an input to write).
    def replica(i, t)
      out = FFI::MemoryPointer.new(:pointer)
      Nabla.check(Nabla.nabla_trainer_replica(@trainer, i, t.ptr, out))
      @ctx.wrap(out.read_pointer)
    end

    # Runs forward and backward; returns the loss.
    def run
      loss = FFI::MemoryPointer.new(:float)
      Nabla.check(Nabla.nabla_trainer_run(@trainer, loss))
      loss.read_float
    end

    # One AdamW step; returns the gradient norm before clipping.
    def update(lr, clip: 0.0)
      norm = FFI::MemoryPointer.new(:double)
      Nabla.check(Nabla.nabla_trainer_update(@trainer, lr, clip, norm))
      norm.read_double
    end

    # The weights, AdamW's moments and step count, to continue from with
    # #load (in a job every process calls both; rank 0 writes).
    def save(path) = Nabla.check(Nabla.nabla_trainer_save(@trainer, path, nil))
    def load(path) = Nabla.check(Nabla.nabla_trainer_load(@trainer, path, nil))

    def steps
      out = FFI::MemoryPointer.new(:int64)
      Nabla.check(Nabla.nabla_trainer_steps(@trainer, out))
      out.read_int64
    end

    def parameters
      count = FFI::MemoryPointer.new(:int64)
      elements = FFI::MemoryPointer.new(:int64)
      Nabla.check(Nabla.nabla_trainer_parameters(@trainer, count, elements, nil))
      [count.read_int64, elements.read_int64]
    end
  end
end
