// comm_phold: the PHOLD benchmark on libcomm's simulation engine, with ROSS's option names.
//
//   comm_phold [--nlp=8] [--start-events=1] [--remote=0.25] [--lookahead=1] [--mean=1]
//              [--end=100000] [--synch=2] [--seed=1] [--partitions=1] [--progress|--no-progress]
//              [--json] [--quiet] [--lp-digests PREFIX]
//
// --nlp is LPs per process and LP ids are global, so 1 x 64 and 2 x 32 processes run the same
// model (same digest). Runs alone, under mpirun and srun --mpi=pmix (PMIx), or started by hand
// with COMM_BOOTSTRAP_ADDRESS, COMM_RANK and COMM_SIZE (see comm/bootstrap.hpp). Rank 0 prints the
// configuration and ROSS's end-of-run figures; --json ends the output with one JSON line.
#include "comm_phold_model.hpp"

#include <comm/sim/cluster.hpp>
#include <comm/sim/engine.hpp>
#include <comm/sim/report.hpp>

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

namespace {

using namespace comm::sim;

/// Everything the command line sets.
struct options {
  phold::parameters model;
  uint64_t nlp = 8;
  double end = 100000;
  int synch = 2;
  uint64_t seed = 1;
  unsigned partitions = 1;
  int progress = -1;  ///< -1: when stderr is a terminal
  bool json = false;
  bool quiet = false;
  std::string lp_digests;  ///< prefix of the per-LP digest files ("" : none)
};

void usage(std::FILE* out) {
  std::fputs(
      "usage: comm_phold [options]  (values as --name=value or --name value)\n"
      "  --nlp N            LPs per process (ids are global)              [8]\n"
      "  --start-events N   events each LP starts with                    [1]\n"
      "  --remote F         probability of a destination among all LPs    [0.25]\n"
      "  --lookahead F      least delay                                   [1]\n"
      "  --mean F           mean delay, lookahead included (>= lookahead) [1]\n"
      "  --end F            end time                                      [100000]\n"
      "  --synch N          1 sequential (one process), 2 conservative    [2]\n"
      "  --seed N           random seed                                   [1]\n"
      "  --partitions N     partitions per process                        [1]\n"
      "  --progress, --no-progress   progress line on stderr  [when stderr is a terminal]\n"
      "  --json             end with one JSON line of the results\n"
      "  --lp-digests P     write every LP's id, events handled and state digest to P.<rank>\n"
      "  --quiet            print nothing but errors and the JSON line\n",
      out);
}

/// Parses one number; false when `text` is not entirely one, or (integers) T cannot hold it.
template <class T>
bool parse_number(const std::string& text, T* out) {
  char* end = nullptr;
  if constexpr (std::is_floating_point_v<T>) {
    *out = std::strtod(text.c_str(), &end);
  } else {
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
    errno = 0;
    const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
    if (errno == ERANGE || value > static_cast<unsigned long long>(std::numeric_limits<T>::max())) {
      return false;
    }
    *out = static_cast<T>(value);
  }
  return !text.empty() && end != nullptr && *end == '\0';
}

/// Reads the command line; on a mistake prints why and returns false.
bool parse(int argc, char** argv, options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      std::exit(0);
    }
    if (arg == "--json") { o->json = true; continue; }
    if (arg == "--quiet") { o->quiet = true; continue; }
    if (arg == "--progress") { o->progress = 1; continue; }
    if (arg == "--no-progress") { o->progress = 0; continue; }
    std::string value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    }
    bool ok = false;
    if (arg == "--nlp") ok = parse_number(value, &o->nlp);
    else if (arg == "--start-events") ok = parse_number(value, &o->model.start_events);
    else if (arg == "--remote") ok = parse_number(value, &o->model.remote);
    else if (arg == "--lookahead") ok = parse_number(value, &o->model.lookahead);
    else if (arg == "--mean") ok = parse_number(value, &o->model.mean);
    else if (arg == "--end") ok = parse_number(value, &o->end);
    else if (arg == "--synch") ok = parse_number(value, &o->synch);
    else if (arg == "--seed") ok = parse_number(value, &o->seed);
    else if (arg == "--partitions") ok = parse_number(value, &o->partitions);
    else if (arg == "--lp-digests") ok = !(o->lp_digests = value).empty();
    else {
      std::fprintf(stderr, "comm_phold: unknown option %s\n", arg.c_str());
      usage(stderr);
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "comm_phold: %s needs a number (within range), not '%s'\n", arg.c_str(),
                   value.c_str());
      return false;
    }
  }
  const auto& m = o->model;
  const char* problem = nullptr;
  if (!(m.remote >= 0 && m.remote <= 1)) problem = "--remote must be within [0, 1]";
  else if (!(m.lookahead > 0)) problem = "--lookahead must be positive";
  else if (!(m.mean >= m.lookahead)) problem = "--mean must be at least --lookahead";
  else if (o->synch < 1 || o->synch > 3) problem = "--synch must be 1, 2 or 3";
  else if (o->nlp == 0 || o->nlp > 0xffffffffull) problem = "--nlp must be between 1 and 2^32 - 1";
  if (problem != nullptr) {
    std::fprintf(stderr, "comm_phold: %s\n", problem);
    return false;
  }
  return true;
}

void print_configuration(const options& o, const cluster& c) {
  std::printf("PHOLD on libcomm's simulation engine\n");
  std::printf("  processes %d (%s), partitions per process %u, LPs per process %" PRIu64 "\n",
              c.size(), c.transports().c_str(), o.partitions, o.nlp);
  std::printf("  start-events %u, remote %g, lookahead %g, mean %g, end %g, synch %d, seed %" PRIu64
              "\n",
              o.model.start_events, o.model.remote, o.model.lookahead, o.model.mean, o.end, o.synch,
              o.seed);
  std::fflush(stdout);
}

void print_json(const run_result& r, const options& o, const cluster& c) {
  std::printf(
      "{\"committed\":%" PRIu64 ",\"events_per_s\":%.1f,\"efficiency\":%.6f,\"rollbacks\":%" PRIu64
      ",\"remote\":%.6f,\"remote_events\":%" PRIu64 ",\"processes\":%d,\"partitions\":%u,"
      "\"lps\":%" PRIu64 ",\"rounds\":%" PRIu64 ",\"seconds\":%.6f,\"synch\":%d,"
      "\"transports\":\"%s\",\"digest\":\"%016" PRIx64 "\"}\n",
      r.committed, r.events_per_second(), r.efficiency(), r.rollbacks, r.remote_fraction(),
      r.remote, r.processes, r.partitions, r.lp_count, r.rounds, r.seconds, o.synch,
      c.transports().c_str(), r.digest);
}

/// Writes "id events digest" for every LP of this process to <prefix>.<rank>; false on failure.
bool write_lp_digests(const engine<phold::model>& e, const phold::model& model,
                      const std::string& prefix, int rank) {
  const std::string path = prefix + "." + std::to_string(rank);
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) return false;
  e.for_each_lp([&](lp_id id, const phold::model::state& s, uint64_t events) {
    std::fprintf(out, "%u %" PRIu64 " %016" PRIx64 "\n", id, events, model.digest(s));
  });
  return std::fclose(out) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, &o)) return 2;
  std::unique_ptr<cluster> c;
  std::string why;
  if (comm::status st = cluster::join({}, &c, &why); st != comm::status::ok) {
    std::fprintf(stderr, "comm_phold: cannot join the job: %s (%s)\n", why.c_str(),
                 comm::to_string(st));
    return 1;
  }
  const bool talk = c->rank() == 0 && !o.quiet;
  if (talk) print_configuration(o, *c);
  run_config cfg = phold::configuration(o.nlp * static_cast<uint64_t>(c->size()), o.partitions,
                                        o.model, o.end, o.seed);
  cfg.sync = static_cast<sync_mode>(o.synch);
  cfg.progress = o.progress < 0 ? is_terminal(stderr) && !o.quiet : o.progress == 1;
  phold::model model{o.model};
  engine<phold::model> e(*c, cfg, model);
  run_result r;
  if (comm::status st = e.run(&r, &why); st != comm::status::ok) {
    std::fprintf(stderr, "comm_phold: rank %d: %s (%s)\n", c->rank(), why.c_str(),
                 comm::to_string(st));
    return 1;
  }
  if (!o.lp_digests.empty() && !write_lp_digests(e, model, o.lp_digests, c->rank())) {
    std::fprintf(stderr, "comm_phold: cannot write %s.%d\n", o.lp_digests.c_str(), c->rank());
    return 1;
  }
  if (talk) print_summary(stdout, r);
  if (c->rank() == 0 && o.json) print_json(r, o, *c);
  return 0;
}
