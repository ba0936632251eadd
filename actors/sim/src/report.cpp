// The progress line and the end-of-run summary.
#include <comm/sim/report.hpp>

#include <unistd.h>

#include <cinttypes>

namespace comm::sim {

progress_meter::progress_meter(std::FILE* out, double interval)
    : out_(out), interval_(interval), start_(clock::now()), last_print_(start_) {}

void progress_meter::check(sim_time now, uint64_t committed) {
  const clock::time_point t = clock::now();
  const double since = std::chrono::duration<double>(t - last_print_).count();
  // Read the clock about a hundred times per interval, whatever a round costs.
  if (since < interval_ / 200) stride_ *= 2;
  if (since > interval_ / 50 && stride_ > 1) stride_ /= 2;
  next_check_ = calls_ + stride_;
  if (since < interval_) return;
  const double rate = (committed - last_committed_) / since;
  const double elapsed = std::chrono::duration<double>(t - start_).count();
  std::fprintf(out_, "\r  t=%-14.6g committed %-14" PRIu64 " %10.3f M events/s  (%.1f s)   ", now,
               committed, rate / 1e6, elapsed);
  std::fflush(out_);
  printed_ = true;
  last_print_ = t;
  last_committed_ = committed;
}

void progress_meter::finish() {
  if (printed_) std::fputc('\n', out_);
  printed_ = false;
}

bool is_terminal(std::FILE* stream) { return ::isatty(::fileno(stream)) == 1; }

void print_summary(std::FILE* out, const run_result& r) {
  std::fprintf(out, "Simulation summary\n");
  std::fprintf(out, "  processes x partitions   %d x %u, %" PRIu64 " LPs\n", r.processes,
               r.partitions, r.lp_count);
  std::fprintf(out, "  committed events         %" PRIu64 "\n", r.committed);
  std::fprintf(out, "  processed events         %" PRIu64 "\n", r.processed);
  std::fprintf(out, "  efficiency               %.2f %%\n", 100.0 * r.efficiency());
  std::fprintf(out, "  rollbacks                %" PRIu64 "\n", r.rollbacks);
  std::fprintf(out, "  remote events            %" PRIu64 " (%.2f %%)\n", r.remote,
               100.0 * r.remote_fraction());
  std::fprintf(out, "  cross-partition events   %" PRIu64 "\n", r.cross_partition);
  std::fprintf(out, "  sync rounds              %" PRIu64 "\n", r.rounds);
  std::fprintf(out, "  running time             %.4f s\n", r.seconds);
  std::fprintf(out, "  event rate               %.0f events/s\n", r.events_per_second());
  std::fprintf(out, "  digest                   %016" PRIx64 "\n", r.digest);
}

}  // namespace comm::sim
