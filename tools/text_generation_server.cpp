// text_generation_server: Megatron's REST text generation API over a
// checkpoint's model (docs/GENERATION.md): PUT (or POST) /api with
//   {"prompts": ["In the beginning", ...], "tokens_to_generate": 32,
//    "temperature": 0.8, "top_k": 0, "top_p": 0.9, "random_seed": 7}
// answers {"text": [prompt + continuation, ...], "segments": [[each token's
// text], ...], "logprobs": [[...], ...] or null, "tokens": [[new ids], ...],
// "stopped": [bool, ...]}; Megatron's logprobs (tokens_to_generate 0 scores
// the prompts), add_BOS, stop_on_eol, stop_on_double_eol,
// prevent_newline_after_colon, top_p_decay, top_p_bound and no_log too; and
// Megatron's beam search: "beam_width": N (one prompt) answers the N best
// continuations in "text", "segments" and "scores" (with "length_penalty").
// Under mpiexec -n N the model is split over the N ranks (TP N): rank 0
// serves HTTP and hands each request to every rank (between requests the
// ranks sleep, agreeing every 50 ms on what comes next); SIGTERM or SIGINT
// stops it cleanly with exit 0.
//   text_generation_server --load runs/ckpt --vocab-file encoder.json --merge-file vocab.bpe --port 5000
#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <future>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"
#include "tools/generation_model.h"
#include "tools/text_generation.h"

namespace po = boost::program_options;
using json = nlohmann::json;
using namespace megazero;
using I = std::int64_t;

namespace {

std::atomic<int> g_stop{0};
extern "C" void on_stop_signal(int sig) { g_stop = sig; }

// A request as every rank runs it: the prompts already tokenized by rank 0
// (add_BOS applied), the line tokens resolved.
struct Request {
  std::vector<std::vector<I>> prompts;
  generation::GenerateOptions options;
  // Beam search's own two fields (width 0: no beam search); the rest of its
  // options are the generation's (beam_options), so every rank has them from
  // the one place the request carries them.
  std::int64_t beam_width = 0;
  double length_penalty = 1.0;
  bool log = true;  // no_log: false
  generation::BeamOptions beam_options() const {
    generation::BeamOptions b;
    b.width = beam_width;
    b.length_penalty = length_penalty;
    b.max_new_tokens = options.max_new_tokens;
    b.stop_token = options.stop_token;
    b.no_newline_after_colon = options.no_newline_after_colon;
    b.lines = options.lines;
    return b;
  }
  json to_json() const {
    const auto& o = options;
    return {{"prompts", prompts},
            {"tokens_to_generate", o.max_new_tokens},
            {"greedy", o.sampling.greedy},
            {"temperature", o.sampling.temperature},
            {"top_k", o.sampling.top_k},
            {"top_p", o.sampling.top_p},
            {"top_p_decay", o.sampling.top_p_decay},
            {"top_p_bound", o.sampling.top_p_bound},
            {"seed", o.sampling.seed},
            {"stop_token", o.stop_token ? json(*o.stop_token) : json(nullptr)},
            {"line_stop", static_cast<int>(o.line_stop)},
            {"lines", {o.lines.newline, o.lines.double_newline, o.lines.colon}},
            {"no_newline_after_colon", o.no_newline_after_colon},
            {"logprobs", o.logprobs},
            {"beam_width", beam_width},
            {"length_penalty", length_penalty},
            {"log", log}};
  }
  static Request from_json(const json& j) {
    Request r;
    auto& o = r.options;
    r.prompts = j.at("prompts").get<std::vector<std::vector<I>>>();
    o.max_new_tokens = j.at("tokens_to_generate").get<I>();
    o.sampling.greedy = j.at("greedy").get<bool>();
    o.sampling.temperature = j.at("temperature").get<double>();
    o.sampling.top_k = j.at("top_k").get<I>();
    o.sampling.top_p = j.at("top_p").get<double>();
    o.sampling.top_p_decay = j.at("top_p_decay").get<double>();
    o.sampling.top_p_bound = j.at("top_p_bound").get<double>();
    o.sampling.seed = j.at("seed").get<std::uint64_t>();
    if (!j.at("stop_token").is_null()) o.stop_token = j.at("stop_token").get<I>();
    o.line_stop = static_cast<generation::LineStop>(j.at("line_stop").get<int>());
    const auto lines = j.at("lines").get<std::vector<I>>();
    o.lines = {lines.at(0), lines.at(1), lines.at(2)};
    o.no_newline_after_colon = j.at("no_newline_after_colon").get<bool>();
    o.logprobs = j.at("logprobs").get<bool>();
    r.beam_width = j.at("beam_width").get<I>();
    r.length_penalty = j.at("length_penalty").get<double>();
    r.log = j.at("log").get<bool>();
    return r;
  }
};

struct Reply {
  int status = 200;
  std::string body;
};
Reply error_reply(int status, const std::string& message) { return {status, json{{"error", message}}.dump() + "\n"}; }

// The fields of Megatron's request this server takes.
const std::set<std::string> kFields = {
    "prompts",     "prompt_tokens", "tokens_to_generate", "temperature",
    "top_k",       "top_p",         "top_p_decay",        "top_p_bound",
    "random_seed", "greedy",        "stop_token",         "logprobs",
    "add_BOS",     "stop_on_eol",   "stop_on_double_eol", "prevent_newline_after_colon",
    "no_log",      "beam_width",    "length_penalty"};
// What shapes sampling (or reports it) and has no effect on beam search,
// which ranks the model's own probabilities: accepted beside beam_width only
// at the value that changes nothing.
const std::map<std::string, json> kNotForBeams = {{"temperature", 1.0},   {"top_k", 0},
                                                  {"top_p", 0.0},         {"top_p_decay", 0.0},
                                                  {"top_p_bound", 0.0},   {"greedy", false},
                                                  {"random_seed", -1},    {"logprobs", false},
                                                  {"stop_on_eol", false}, {"stop_on_double_eol", false}};

// The sampling options' names in errors: the request's fields.
const generation::OptionNames kFieldNames = {"'temperature'", "'top_k'",       "'top_p'",
                                             "'greedy'",      "'top_p_decay'", "'top_p_bound'"};

// Rank 0: a request body as the ranks will run it; ConfigError naming the
// field for anything malformed or out of range. `lines`: the tokenizer's
// line tokens (all -1 without one).
Request parse_request(const std::string& body, const hf::CheckpointModel& model, data::Tokenizer* tok,
                      const generation::LineTokens& lines) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw ConfigError(std::string("the request is not JSON: ") + e.what());
  }
  MZ_REQUIRE(j.is_object(),
             "the request must be a JSON object such as {\"prompts\": [\"...\"], \"tokens_to_generate\": 32}");
  for (const auto& [key, value] : j.items())
    MZ_REQUIRE(kFields.count(key), "unknown field '", key, "'; the fields are prompts (or prompt_tokens), ",
               "tokens_to_generate, temperature, top_k, top_p, top_p_decay, top_p_bound, random_seed, greedy, ",
               "stop_token, logprobs, add_BOS, stop_on_eol, stop_on_double_eol, prevent_newline_after_colon, "
               "no_log, beam_width and length_penalty");
  auto boolean = [&](const char* k) {
    if (!j.contains(k)) return false;
    MZ_REQUIRE(j[k].is_boolean(), "'", k, "' must be true or false, got ", j[k].dump());
    return j[k].get<bool>();
  };
  auto number = [&](const char* k, double dflt) {
    if (!j.contains(k)) return dflt;
    MZ_REQUIRE(j[k].is_number(), "'", k, "' must be a number, got ", j[k].dump());
    return j[k].get<double>();
  };
  auto integer = [&](const char* k, I dflt) {
    if (!j.contains(k)) return dflt;
    MZ_REQUIRE(j[k].is_number_integer(), "'", k, "' must be a whole number, got ", j[k].dump());
    return j[k].get<I>();
  };
  Request r;
  const I vocab = model.config().vocab_size, positions = model.config().max_position_embeddings;
  MZ_REQUIRE(j.contains("prompts") != j.contains("prompt_tokens"),
             j.contains("prompts") ? "'prompts' and 'prompt_tokens' both give the prompts; keep one"
                                   : "give 'prompts' (a list of strings) or 'prompt_tokens' (a list of lists of ids)");
  if (j.contains("prompts")) {
    MZ_REQUIRE(tok,
               "'prompts' are text, but the server was started without a tokenizer (--vocab-file and "
               "--merge-file, or --tokenizer-type); send 'prompt_tokens' instead");
    MZ_REQUIRE(j["prompts"].is_array() && !j["prompts"].empty(), "'prompts' must be a non-empty list of strings");
    for (const auto& p : j["prompts"]) {
      MZ_REQUIRE(p.is_string(), "'prompts' must be a list of strings, got ", p.dump());
      const auto ids = tok->encode(p.get<std::string>());
      r.prompts.emplace_back(ids.begin(), ids.end());
    }
  } else {
    MZ_REQUIRE(j["prompt_tokens"].is_array() && !j["prompt_tokens"].empty(),
               "'prompt_tokens' must be a non-empty list of lists of token ids");
    for (const auto& p : j["prompt_tokens"]) {
      MZ_REQUIRE(p.is_array(), "'prompt_tokens' must be a list of lists of token ids, got ", p.dump());
      std::vector<I> ids;
      for (const auto& t : p) {
        MZ_REQUIRE(t.is_number_integer(), "'prompt_tokens': ", t.dump(), " is not a token id");
        ids.push_back(t.get<I>());
      }
      r.prompts.push_back(ids);
    }
  }
  auto& o = r.options;
  o.logprobs = boolean("logprobs");
  o.max_new_tokens = integer("tokens_to_generate", 64);
  MZ_REQUIRE(o.max_new_tokens > 0 || (o.max_new_tokens == 0 && o.logprobs), "'tokens_to_generate' must be positive",
             o.max_new_tokens == 0 ? " (0 scores the prompts alone: add \"logprobs\": true)" : "", ", got ",
             o.max_new_tokens);
  if (boolean("add_BOS")) {
    MZ_REQUIRE(tok,
               "'add_BOS' puts the tokenizer's end-of-document token first, and the server was started without a "
               "tokenizer; put that id first in 'prompt_tokens' instead");
    MZ_REQUIRE(tok->eod() < vocab, "'add_BOS': the ", tok->name(), " tokenizer's end-of-document token ", tok->eod(),
               " is outside the model's vocabulary [0, ", vocab, ")");
    for (auto& p : r.prompts) p.insert(p.begin(), tok->eod());
  }
  for (std::size_t i = 0; i < r.prompts.size(); ++i) {
    const auto& p = r.prompts[i];
    MZ_REQUIRE(!p.empty(), "prompt ", i, " is empty");
    for (I t : p)
      MZ_REQUIRE(t >= 0 && t < vocab, "prompt ", i, ": token id ", t, " is outside the model's vocabulary [0, ", vocab,
                 ")");
    const I n = static_cast<I>(p.size());
    MZ_REQUIRE(n + o.max_new_tokens <= positions, "prompt ", i, " of ", n, " tokens and 'tokens_to_generate' ",
               o.max_new_tokens, " exceed the model's ", positions, " positions",
               n < positions ? detail::concat("; ask for ", positions - n, " tokens or fewer")
                             : std::string("; shorten the prompt"));
  }
  o.sampling.greedy = boolean("greedy");
  o.sampling.temperature = number("temperature", 1.0);
  o.sampling.top_k = integer("top_k", 0);
  o.sampling.top_p = number("top_p", 0.0);
  o.sampling.top_p_decay = number("top_p_decay", 0.0);
  o.sampling.top_p_bound = number("top_p_bound", 0.0);
  // Megatron's 0 is our 1 (the whole vocabulary); the other ranges are generation::validate's.
  MZ_REQUIRE(o.sampling.top_p >= 0 && o.sampling.top_p <= 1, "'top_p' must be in [0, 1] (0 = off, as Megatron's), got ",
             o.sampling.top_p);
  if (o.sampling.top_p == 0) o.sampling.top_p = 1;
  const bool eol = boolean("stop_on_eol"), double_eol = boolean("stop_on_double_eol");
  MZ_REQUIRE(!(eol && double_eol),
             "'stop_on_eol' (stop after a line) and 'stop_on_double_eol' (after an empty line) contradict each "
             "other; keep one");
  auto need_lines = [&](const char* field, bool ok, const char* what) {
    MZ_REQUIRE(tok, "'", field,
               "' needs the tokenizer's line tokens, and the server was started without a "
               "tokenizer; start it with one (--vocab-file and --merge-file, or --tokenizer-type)");
    MZ_REQUIRE(ok, "'", field, "': the ", tok->name(), " tokenizer has no ", what, " token in the model's vocabulary");
  };
  if (eol || double_eol) {
    need_lines(eol ? "stop_on_eol" : "stop_on_double_eol", lines.newline >= 0 || lines.double_newline >= 0,
               "\"\\n\" or \"\\n\\n\"");
    o.line_stop = eol ? generation::LineStop::Line : generation::LineStop::DoubleLine;
  }
  o.no_newline_after_colon = boolean("prevent_newline_after_colon");
  if (o.no_newline_after_colon)
    need_lines("prevent_newline_after_colon", lines.newline >= 0 && lines.colon >= 0, "\"\\n\" or no \":\"");
  o.lines = lines;
  r.log = !boolean("no_log");
  const I seed = integer("random_seed", 1234);
  MZ_REQUIRE(seed >= -1, "'random_seed' must be a seed (0 or more) or -1 (a new one each request), got ", seed);
  o.sampling.seed = seed == -1 ? std::random_device{}() : static_cast<std::uint64_t>(seed);
  if (j.contains("stop_token")) {
    MZ_REQUIRE(j["stop_token"].is_null() || j["stop_token"].is_number_integer(),
               "'stop_token' must be a token id, or null for none");
    if (j["stop_token"].is_null())
      o.stop_token = std::nullopt;
    else
      o.stop_token = generation::stop_token_of(j["stop_token"].get<I>(), "'stop_token'", model, tok);
  } else {
    o.stop_token = generation::stop_token_of(std::nullopt, "'stop_token'", model, tok);
  }
  generation::validate(o.sampling, kFieldNames);
  // Megatron's beam search: one prompt, its best beam_width continuations.
  if (j.contains("beam_width") && !j["beam_width"].is_null()) {
    MZ_REQUIRE(j["beam_width"].is_number_integer(), "'beam_width' must be a whole number, got ",
               j["beam_width"].dump());
    r.beam_width = j["beam_width"].get<I>();
    r.length_penalty = number("length_penalty", 1.0);
    MZ_REQUIRE(r.prompts.size() == 1, "'beam_width': beam search takes one prompt (Megatron's batch of 1), got ",
               r.prompts.size(), "; send one request a prompt");
    for (const auto& [key, neutral] : kNotForBeams) {
      if (!j.contains(key)) continue;
      const json& v = j[key];
      const bool same =
          v == neutral || (v.is_number() && neutral.is_number() && v.get<double>() == neutral.get<double>());
      MZ_REQUIRE(same, "'", key, "': ", v.dump(), " has no effect on beam search ('beam_width' ", r.beam_width,
                 "), which ranks the model's own probabilities: leave it out, or drop 'beam_width'");
    }
    generation::validate(r.beam_options(), "'beam_width'", "'length_penalty'");
  } else {
    MZ_REQUIRE(
        !j.contains("length_penalty") || (j["length_penalty"].is_number() && j["length_penalty"].get<double>() == 1.0),
        "'length_penalty' scores beam search's hypotheses: add 'beam_width', or leave it out");
  }
  return r;
}

// Every rank: the request's generations (collective over the model's ranks);
// rank 0's reply. A ConfigError from the generation is the same on every rank.
Reply run_request(hf::CheckpointModel& model, const data::Tokenizer* tok, const Request& r) {
  json text = json::array(), segments = json::array(), tokens = json::array(), stopped = json::array(),
       logprobs = json::array();
  auto add_text = [&](const std::vector<I>& prompt, const std::vector<I>& generated) {
    if (!tok) return;
    std::vector<std::int32_t> all(prompt.begin(), prompt.end());
    all.insert(all.end(), generated.begin(), generated.end());
    text.push_back(tok->decode(all));
    json pieces = json::array();
    for (std::int32_t t : all) pieces.push_back(tok->decode({t}));
    segments.push_back(pieces);
  };
  if (r.beam_width > 0) {
    // Megatron's reply: each hypothesis's text and segments, best first, and its score.
    json scores = json::array();
    for (const auto& h : generation::beam_search(model, r.prompts.front(), r.beam_options())) {
      tokens.push_back(h.tokens);
      stopped.push_back(h.stopped);
      scores.push_back(h.score);
      add_text(r.prompts.front(), h.tokens);
    }
    json j = {{"tokens", tokens}, {"stopped", stopped}, {"scores", scores}};
    if (tok) {
      j["text"] = text;
      j["segments"] = segments;
    }
    return {200, j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"};
  }
  for (const auto& prompt : r.prompts) {
    const auto g = generation::generate(model, prompt, r.options);
    tokens.push_back(g.tokens);
    stopped.push_back(g.stopped);
    logprobs.push_back(g.logprobs);
    add_text(prompt, g.tokens);
  }
  json j = {{"tokens", tokens}, {"stopped", stopped}, {"logprobs", r.options.logprobs ? logprobs : json(nullptr)}};
  if (tok) {
    j["text"] = text;
    j["segments"] = segments;
  }
  // Tokens may end inside a UTF-8 character (byte-level vocabularies): invalid bytes become U+FFFD.
  return {200, j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"};
}

// Between requests every rank sleeps kPoll (rank 0 wakes early for a
// request or a signal), then all agree in one tiny all-reduce on what comes
// next: idle ranks hold no core (a collective waited for without end would
// spin one: MPI's waits poll), and a request waits kPoll at most.
constexpr std::chrono::milliseconds kPoll{50};
enum class Next { Idle = 0, Request = 1, Stop = 2 };
Next agree_next(Communicator& world, Next mine) {
  if (world.size() == 1) return mine;
  return static_cast<Next>(static_cast<int>(all_reduce_value(world, static_cast<double>(mine), ReduceOp::Max)));
}

// Rank 0: HTTP in a thread of its own; requests queued to this thread, which
// hands each to every rank in turn.
int serve(hf::CheckpointModel& model, data::Tokenizer* tok, Communicator& world, httplib::Server& server,
          const std::string& host, int bound) {
  const generation::LineTokens lines =
      tok ? generation::line_tokens(*tok, model.config().vocab_size) : generation::LineTokens{};
  struct Job {
    Request request;
    std::promise<Reply> reply;
  };
  std::mutex mu, parsing;  // parsing: the tokenizer is not thread-safe (its cache)
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> jobs;
  auto handle = [&](const httplib::Request& req, httplib::Response& res) {
    Reply reply;
    try {
      auto job = std::make_shared<Job>();
      {
        std::lock_guard<std::mutex> lock(parsing);
        job->request = parse_request(req.body, model, tok, lines);
      }
      auto answer = job->reply.get_future();
      {
        std::lock_guard<std::mutex> lock(mu);
        jobs.push_back(job);
      }
      cv.notify_one();
      reply = answer.get();
    } catch (const ConfigError& e) {
      reply = error_reply(400, e.what());
    }
    res.status = reply.status;
    res.set_content(reply.body, "application/json");
  };
  server.Put("/api", handle);
  server.Post("/api", handle);
  std::thread http([&] { server.listen_after_bind(); });
  std::printf("text_generation_server: serving %s (iteration %lld) at http://%s:%d/api (PUT)%s\n",
              model.checkpoint().c_str(), static_cast<long long>(model.iteration()), host.c_str(), bound,
              model.tensor_parallel_size() > 1
                  ? detail::concat(", split over ", model.tensor_parallel_size(), " ranks (tensor parallel)").c_str()
                  : "");
  std::fflush(stdout);
  I served = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, kPoll, [&] { return !jobs.empty() || g_stop != 0; });
      if (g_stop == 0 && !jobs.empty()) {
        job = jobs.front();
        jobs.pop_front();
      }
    }
    const Next next = agree_next(world, g_stop != 0 ? Next::Stop : job ? Next::Request : Next::Idle);
    if (next == Next::Stop) break;
    if (next == Next::Idle) continue;
    broadcast_string(world, job->request.to_json().dump());
    const auto t0 = std::chrono::steady_clock::now();
    Reply reply;
    try {
      reply = run_request(model, tok, job->request);
    } catch (const ConfigError& e) {
      reply = error_reply(400, e.what());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++served;
    if (job->request.log)
      std::printf("text_generation_server: request %lld: %zu prompt%s, up to %lld new tokens each, status %d, %.2f s\n",
                  static_cast<long long>(served), job->request.prompts.size(),
                  job->request.prompts.size() == 1 ? "" : "s",
                  static_cast<long long>(job->request.options.max_new_tokens), reply.status, seconds);
    std::fflush(stdout);
    job->reply.set_value(reply);
  }
  server.stop();
  http.join();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& job : jobs) job->reply.set_value(error_reply(503, "the server is stopping"));
  }
  std::printf("text_generation_server: stopped by signal %d after %lld requests\n", static_cast<int>(g_stop),
              static_cast<long long>(served));
  std::fflush(stdout);
  return 0;
}

// The other ranks: each request rank 0 hands out, until it stops.
int follow(hf::CheckpointModel& model, const data::Tokenizer* tok, Communicator& world) {
  for (;;) {
    std::this_thread::sleep_for(kPoll);
    const Next next = agree_next(world, Next::Idle);
    if (next == Next::Stop) return 0;
    if (next == Next::Idle) continue;
    try {
      run_request(model, tok, Request::from_json(json::parse(broadcast_string(world, ""))));
    } catch (const ConfigError&) {
      // Rank 0 met the same error and answers it.
    }
  }
}

int run(int argc, char** argv) {
  try {
    auto world = MpiCommunicator::world();
    const bool root = world->rank() == 0;
    generation::ModelOptions m;
    std::string host = "127.0.0.1";
    int port = 5000;
    po::options_description d("text_generation_server options");
    generation::add_model_options(d, m);
    d.add_options()("host", po::value(&host),
                    "the address to listen on: 127.0.0.1 (this machine only, the default) or 0.0.0.0 (every "
                    "interface, as Megatron's server)")("port", po::value(&port),
                                                        "the TCP port (5000, as Megatron's); 0: any free one, printed");
    bool help = false;
    d.add_options()("help,h", po::bool_switch(&help), "print this help");
    parse_command_line(argc, argv, d, "text_generation_server");
    if (help) {
      if (root)
        std::cout << "usage: text_generation_server --load DIR [tokenizer flags] [--port N] [options]\n"
                     "then: PUT http://HOST:PORT/api {\"prompts\": [\"...\"], \"tokens_to_generate\": 32, "
                     "\"temperature\": 1.0, \"top_k\": 0, \"top_p\": 0.0, \"random_seed\": 1234}\n"
                     "  also: \"logprobs\": true (tokens_to_generate 0 scores the prompts), \"add_BOS\", "
                     "\"stop_on_eol\", \"stop_on_double_eol\", \"prevent_newline_after_colon\", \"top_p_decay\", "
                     "\"top_p_bound\", \"no_log\", \"greedy\", \"stop_token\", \"prompt_tokens\", "
                     "\"beam_width\" and \"length_penalty\" (beam search, one prompt) "
                     "(docs/GENERATION.md)\n\n"
                  << d << "\n";
      return 0;
    }
    MZ_REQUIRE(port >= 0 && port <= 65535, "--port must be 0 (any free port) to 65535, got ", port);
    const std::unique_ptr<data::Tokenizer> tok = generation::open_tokenizer(m);
    // Signals only set a flag: rank 0 stops between requests and tells the others.
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGINT, on_stop_signal);
    const auto model = generation::open_model(m, tok.get(), *world, "text_generation_server");
    // Rank 0 listens; every rank learns whether it could.
    httplib::Server server;
    // SO_REUSEADDR only (a restart may take the port of a server just
    // stopped), not httplib's SO_REUSEPORT: with it a second server bound
    // the same port silently, and the kernel split the requests between them.
    server.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    int bound = -1;
    run_consistently(*world, [&] {
      if (!root) return;
      bound = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
      MZ_REQUIRE(bound > 0, "--host ", host, " --port ", port,
                 ": cannot listen there (the port is in use, or the address is not this machine's); choose another "
                 "--port, or 0 for any free one");
    });
    return root ? serve(*model, tok.get(), *world, server, host, bound) : follow(*model, tok.get(), *world);
  } catch (const AgreedConfigError&) {
    throw;
  } catch (const ConfigError& e) {
    throw AgreedConfigError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) { return run_main("text_generation_server", argc, argv, run); }
