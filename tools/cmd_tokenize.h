// `nabla tokenize`: text on stdin to token ids on stdout, or back.
// `nabla tokenizer train|convert`: a BPE tokenizer as tokenizer.json.
#pragma once

#include <string>

#include "commands.h"
#include "nabla/tokenizer.h"

namespace nabla::cli {

struct TokenizeArgs {
  std::string tokenizer = "byte";  // byte, gpt2, a tokenizer.json or a GGUF model
  std::string vocab;               // GPT-2 vocabulary folder; "" = find_gpt2_vocab()
  bool decode = false;             // ids to text
  bool whole = false;              // encode all of stdin as one text (one output line)
  std::string dataset_out;         // write the corpus's token streams here instead
  std::string text;                // corpus for dataset_out; "" = fortunes
};

// Encodes each line of stdin (without its '\n') and prints its ids separated
// by spaces, one output line per input line; with `whole`, encodes stdin as
// one text, newlines included. With `decode`, reads lines of ids and prints
// each line's text followed by '\n'. With `dataset_out`, writes the train and
// val token streams of the corpus `text` (i32 tensors "train" and "val") as
// load_text_dataset makes them for `nabla train gpt2`, so another framework
// can train on exactly the same data.
int run_tokenize(const TokenizeArgs& opt);

struct TokenizerArgs {
  std::string text;              // train: corpus file or folder; "" = fortunes
  int vocab_size = 4096;         // train
  std::string pattern = "gpt2";  // train: the pre-tokenizer
  std::string tokenizer;         // convert: byte is not BPE; gpt2, a tokenizer.json or a GGUF model
  std::string vocab;             // convert: GPT-2's folder
  std::string out;               // the tokenizer.json to write
};
// Trains a byte-level BPE on the corpus's documents and writes it.
int run_tokenizer_train(const TokenizerArgs& opt);
// Writes a BPE tokenizer nabla reads (GPT-2's files) as tokenizer.json.
int run_tokenizer_convert(const TokenizerArgs& opt);

}  // namespace nabla::cli
