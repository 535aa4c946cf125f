// SentencePiece tokenizers (a tokenizer.model file, e.g. Llama 2's), as
// Megatron's tokenizer types of the same names encode and decode:
//  - Llama2Tokenizer: every document starts with the model's beginning-of-
//    sentence id (Llama 2's: 1); its end-of-sentence id (2) ends a document;
//  - GPTSentencePieceTokenizer: the pieces alone; the end-of-sentence id ends
//    a document.
// The vocabulary is the model's pieces, no ids added. Megatron's plain
// SentencePieceTokenizer (which appends <CLS>, <SEP>, <EOD>, <MASK>, ... ids
// for BERT/T5) is not one of them: make_tokenizer refuses it naming these.
//
// SentencePiece itself is loaded at run time from libmegazero_sentencepiece.so
// (data/sentencepiece_module.cpp says why), found through
// $MEGAZERO_SENTENCEPIECE_MODULE, beside the executable or in ../lib from it
// (the GPU bundle's layout), or where the build made it.
#pragma once

#include <string>

#include "megazero/data/gpt2_tokenizer.h"

namespace megazero::data {

class SentencePieceTokenizer : public Tokenizer {
 public:
  enum class Kind { Llama2, GptSentencePiece };
  // Throws ConfigError naming --tokenizer-model when the file is missing or
  // not a SentencePiece model, or the model has no end-of-sentence id.
  SentencePieceTokenizer(const std::string& model_file, Kind kind);
  ~SentencePieceTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) override;
  // Control ids (BOS, EOS) decode to nothing; an id outside the model's
  // pieces (a padded vocabulary's row) is a ConfigError naming it.
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return pieces_; }
  std::int32_t eod() const override { return eos_; }
  std::int32_t bos() const { return bos_; }
  std::string name() const override { return kind_ == Kind::Llama2 ? "Llama2Tokenizer" : "GPTSentencePieceTokenizer"; }
  // The model loaded again (SentencePiece keeps its state behind the module).
  std::unique_ptr<Tokenizer> clone() const override;

 private:
  void* sp_ = nullptr;  // the module's model
  std::string model_file_;
  Kind kind_;
  std::int32_t pieces_ = 0;
  std::int32_t bos_ = -1, eos_ = -1;
};

}  // namespace megazero::data
