#include "megazero/data/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "megazero/core/error.h"
#include "megazero/data/sentencepiece_module.h"

namespace megazero::data {

namespace {

// libmegazero_sentencepiece.so's entry points, resolved once per process and
// never unloaded.
struct Module {
  decltype(&mz_sp_load) load = nullptr;
  decltype(&mz_sp_free) free = nullptr;
  decltype(&mz_sp_info) info = nullptr;
  decltype(&mz_sp_encode) encode = nullptr;
  decltype(&mz_sp_decode) decode = nullptr;
};

std::vector<std::string> module_candidates() {
  constexpr const char* kName = "libmegazero_sentencepiece.so";
  std::vector<std::string> out;
  if (const char* env = std::getenv("MEGAZERO_SENTENCEPIECE_MODULE"); env && *env) return {env};
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / kName).string());
    out.push_back((exe.parent_path().parent_path() / "lib" / kName).string());
  }
#ifdef MZ_SENTENCEPIECE_MODULE
  out.push_back(MZ_SENTENCEPIECE_MODULE);  // where this build made it
#endif
  return out;
}

const Module& module() {
  static Module m;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    void* lib = nullptr;
    for (const auto& path : module_candidates()) {
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      // Local and deep-bound: SentencePiece's own protobuf stays its own.
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (!lib) {
        error = detail::concat("SentencePiece support ", path, " could not be loaded (", dlerror(),
                               "); install libsentencepiece0 (tools/install_deps.sh)");
        return;
      }
      break;
    }
    if (!lib) {
      error = detail::concat("SentencePiece support (libmegazero_sentencepiece.so) was not found: looked at ", tried,
                             "; build megazero's tools, or set MEGAZERO_SENTENCEPIECE_MODULE to the file");
      return;
    }
    auto sym = [&](const char* name) { return dlsym(lib, name); };
    auto abi = reinterpret_cast<decltype(&mz_sp_abi_version)>(sym("mz_sp_abi_version"));
    if (!abi || abi() != MZ_SP_ABI_VERSION) {
      error = "libmegazero_sentencepiece.so is from another megazero build (its interface differs): rebuild it";
      return;
    }
    m.load = reinterpret_cast<decltype(m.load)>(sym("mz_sp_load"));
    m.free = reinterpret_cast<decltype(m.free)>(sym("mz_sp_free"));
    m.info = reinterpret_cast<decltype(m.info)>(sym("mz_sp_info"));
    m.encode = reinterpret_cast<decltype(m.encode)>(sym("mz_sp_encode"));
    m.decode = reinterpret_cast<decltype(m.decode)>(sym("mz_sp_decode"));
    if (!m.load || !m.free || !m.info || !m.encode || !m.decode) {
      m = Module{};
      error = "libmegazero_sentencepiece.so lacks an entry point: rebuild it";
    }
  });
  MZ_REQUIRE(m.load != nullptr, error);
  return m;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, Kind kind)
    : model_file_(model_file), kind_(kind) {
  const std::string type = name();
  MZ_REQUIRE(!model_file.empty(), "--tokenizer-type ", type,
             " needs --tokenizer-model: the SentencePiece model file (e.g. Llama 2's tokenizer.model)");
  std::error_code ec;
  MZ_REQUIRE(std::filesystem::is_regular_file(model_file, ec), "--tokenizer-model ", model_file,
             ": no such file; pass the SentencePiece model (tokenizer.model)");
  char err[512] = {};
  sp_ = module().load(model_file.c_str(), err, sizeof err);
  MZ_REQUIRE(sp_ != nullptr, "--tokenizer-model ", model_file, ": not a SentencePiece model (", err,
             "); pass the tokenizer.model file that came with the model");
  module().info(sp_, &pieces_, &bos_, &eos_);
  MZ_REQUIRE(eos_ >= 0, "--tokenizer-model ", model_file,
             ": the model has no end-of-sentence piece, which ends each document for ", type);
  MZ_REQUIRE(kind_ != Kind::Llama2 || bos_ >= 0, "--tokenizer-model ", model_file,
             ": the model has no beginning-of-sentence piece, which Llama2Tokenizer puts first in each document; "
             "use --tokenizer-type GPTSentencePieceTokenizer");
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (sp_) module().free(sp_);
}

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text) {
  const std::size_t first = kind_ == Kind::Llama2 ? 1 : 0;  // Megatron's tokenize(s, bos=True)
  std::vector<std::int32_t> out(first + text.size() + 1);
  char err[512] = {};
  for (;;) {
    const long n =
        module().encode(sp_, text.data(), text.size(), out.data() + first, out.size() - first, err, sizeof err);
    MZ_REQUIRE(n >= 0, name(), " could not encode a document: ", err);
    if (static_cast<std::size_t>(n) <= out.size() - first) {
      out.resize(first + static_cast<std::size_t>(n));
      break;
    }
    out.resize(first + static_cast<std::size_t>(n));  // more ids than bytes: again with room for all
  }
  if (first) out[0] = bos_;
  return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  for (std::int32_t id : ids)
    MZ_REQUIRE(id >= 0 && id < pieces_, name(), ": token id ", id, " is outside the model's ", pieces_,
               " pieces (a padded vocabulary's row?)");
  std::string text(ids.size() * 8 + 16, '\0');
  char err[512] = {};
  for (;;) {
    const long n = module().decode(sp_, ids.data(), ids.size(), text.data(), text.size(), err, sizeof err);
    MZ_REQUIRE(n >= 0, name(), " could not decode: ", err);
    const bool fits = static_cast<std::size_t>(n) <= text.size();
    text.resize(static_cast<std::size_t>(n));
    if (fits) return text;
  }
}

std::unique_ptr<Tokenizer> SentencePieceTokenizer::clone() const {
  return std::make_unique<SentencePieceTokenizer>(model_file_, kind_);
}

}  // namespace megazero::data
