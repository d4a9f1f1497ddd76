// `nabla tokenize`: text on stdin to token ids on stdout, or back.
#pragma once

#include <string>

#include "commands.h"

namespace nabla::cli {

struct TokenizeArgs {
  std::string tokenizer = "byte";  // byte or gpt2
  std::string vocab;               // GPT-2 vocabulary folder; "" = find_gpt2_vocab()
  bool decode = false;             // ids to text
  bool whole = false;              // encode all of stdin as one text (one output line)
};

// Encodes each line of stdin (without its '\n') and prints its ids separated
// by spaces, one output line per input line; with `whole`, encodes stdin as
// one text, newlines included. With `decode`, reads lines of ids and prints
// each line's text followed by '\n'.
int run_tokenize(const TokenizeArgs& opt);

}  // namespace nabla::cli
