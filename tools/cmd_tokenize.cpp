// `nabla tokenize`: encodes stdin with a tokenizer, or decodes ids.
#include "cmd_tokenize.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "nabla/error.h"
#include "nabla/gguf.h"
#include "nabla/io.h"
#include "nabla/text_data.h"
#include "nabla/tokenizer.h"

namespace nabla::cli {
namespace {

void write(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size())
    throw IoError("tokenize: cannot write to stdout");
}

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, ids[i]);
    out.append(buf, end);
  }
  out += '\n';
}

std::vector<int32_t> parse_ids(const std::string& line, size_t line_no) {
  std::vector<int32_t> ids;
  const char* p = line.data();
  const char* end = p + line.size();
  while (p < end) {
    if (*p == ' ' || *p == '\t' || *p == '\r') {
      ++p;
      continue;
    }
    int32_t id = 0;
    auto [next, ec] = std::from_chars(p, end, id);
    if (ec != std::errc() || (next < end && *next != ' ' && *next != '\t' && *next != '\r')) {
      const char* stop = p;
      while (stop < end && *stop != ' ' && *stop != '\t') ++stop;
      throw UsageError("tokenize --decode: line " + std::to_string(line_no) + ": '" +
                       std::string(p, stop) + "' is not a token id");
    }
    ids.push_back(id);
    p = next;
  }
  return ids;
}

}  // namespace

int run_tokenize(const TokenizeArgs& opt) {
  std::unique_ptr<Tokenizer> tok = make_tokenizer(opt.tokenizer, opt.vocab);
  if (!opt.dataset_out.empty()) {
    TextDataOptions topt;
    topt.path = opt.text;
    TextDataset data = load_text_dataset(*tok, topt);
    auto stream = [](const std::vector<int32_t>& ids) {
      return Tensor::from_vector<int32_t>({int64_t(ids.size())}, ids);
    };
    save_safetensors(opt.dataset_out, {{"train", stream(data.train)}, {"val", stream(data.val)}},
                     {{"tokenizer", tok->name()}, {"documents", std::to_string(data.documents)}});
    std::printf("%s: %zu training and %zu validation tokens (%s tokenizer)\n", opt.dataset_out.c_str(),
                data.train.size(), data.val.size(), tok->name().c_str());
    return kExitOk;
  }
  std::ios::sync_with_stdio(false);
  std::string out;
  if (opt.whole && !opt.decode) {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    append_ids(out, tok->encode(text));
    write(out);
    return std::fflush(stdout) == 0 ? kExitOk : kExitFailed;
  }
  std::string line;
  for (size_t line_no = 1; std::getline(std::cin, line); ++line_no) {
    if (opt.decode) {
      out += tok->decode(parse_ids(line, line_no));
      out += '\n';
    } else {
      append_ids(out, tok->encode(line));
    }
    if (out.size() > (1 << 16)) {
      write(out);
      out.clear();
    }
  }
  write(out);
  if (std::cin.bad()) throw IoError("tokenize: cannot read stdin");
  return std::fflush(stdout) == 0 ? kExitOk : kExitFailed;
}

int run_tokenizer_train(const TokenizerArgs& opt) {
  const std::string path = opt.text.empty() ? find_fortunes() : opt.text;
  if (path.empty()) throw IoError("tokenizer train: no --text given and Debian's fortunes are not installed");
  std::string corpus;
  for (const std::string& doc : read_text_documents(path)) {
    corpus += doc;
    corpus += '\n';
  }
  std::unique_ptr<BpeTokenizer> tok = BpeTokenizer::train(corpus, opt.vocab_size, parse_pre_tokenizer(opt.pattern));
  tok->save_json(opt.out);
  const size_t ids = tok->encode(corpus).size();
  std::printf("%s: %d tokens (%s pattern); the corpus's %zu bytes are %zu tokens (%.2f bytes per token)\n",
              opt.out.c_str(), tok->vocab_size(), opt.pattern.c_str(), corpus.size(), ids,
              double(corpus.size()) / double(std::max<size_t>(ids, 1)));
  return kExitOk;
}

int run_tokenizer_convert(const TokenizerArgs& opt) {
  std::unique_ptr<Tokenizer> tok = make_tokenizer(opt.tokenizer, opt.vocab);
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
  if (!bpe) throw UsageError("tokenizer convert: the " + tok->name() + " tokenizer is not BPE");
  bpe->save_json(opt.out);
  std::printf("%s: %d tokens\n", opt.out.c_str(), bpe->vocab_size());
  return kExitOk;
}

}  // namespace nabla::cli
