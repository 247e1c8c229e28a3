// The summary's memory lines (report.h MemoryPhasesText): per class of ranks, what the GPU
// reports and what the CUDA stack takes before the allocator, the init phase and the step.
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "shardscope/sim/report/report.h"

namespace shardscope::sim {
namespace {

constexpr double kGiB = double(int64_t{1} << 30);

double GiB(int64_t bytes) { return static_cast<double>(bytes) / kGiB; }

// Shown classes: the first few; a world of identical ranks has one.
constexpr size_t kMaxClassesShown = 4;

}  // namespace

std::string MemoryPhasesText(const traces::ReportMemoryPhases& phases) {
  std::string out;
  for (size_t i = 0; i < std::min(phases.classes.size(), kMaxClassesShown); ++i) {
    const traces::ReportMemoryClass& c = phases.classes[i];
    std::string stack = fmt::format("{:.2f} CUDA context (CUDA {}, {} loading)", GiB(c.cuda_context_bytes),
                                    phases.cuda_version, phases.lazy_loading ? "lazy" : "eager");
    stack += fmt::format(", {:.2f} NCCL ({} communicator{})", GiB(c.nccl_bytes), c.nccl_communicators,
                         c.nccl_communicators == 1 ? "" : "s");
    if (!c.cublas_in_allocator && c.cublas_workspace_bytes > 0) {
      stack += fmt::format(", {:.2f} cuBLAS workspaces", GiB(c.cublas_workspace_bytes));
    }
    if (c.reserved_by_others_bytes > 0) stack += fmt::format(", {:.2f} other processes", GiB(c.reserved_by_others_bytes));
    out += fmt::format("  GPU memory (ranks {}) {:.2f} GiB usable - {} = {:.2f} GiB for the allocator\n", c.ranks,
                       GiB(c.usable_bytes), stack, GiB(c.allocator_capacity_bytes));
    if (c.init_simulated) {
      if (c.init_oom) {
        out += fmt::format("  INIT OUT OF MEMORY ({}): {} needed {:.2f} GiB more with {:.2f} GiB reserved; the job "
                           "never reaches its first step\n",
                           phases.init_framework, c.init_oom_at, GiB(c.init_oom_requested_bytes),
                           GiB(c.init_peak_reserved_bytes));
      } else {
        out += fmt::format("  init phase           {:>12.2f} GiB reserved at its peak ({}: {}), fits\n",
                           GiB(c.init_peak_reserved_bytes), phases.init_framework, c.init_peak_at);
      }
    }
    out += fmt::format("  step                 {:>12.2f} GiB reserved at its peak, {}\n", GiB(c.step_peak_reserved_bytes),
                       c.step_oom ? fmt::format("OUT OF MEMORY ({:.2f} GiB of the allocator's capacity unreserved)",
                                                GiB(c.headroom_bytes))
                                  : fmt::format("{:.2f} GiB headroom", GiB(c.headroom_bytes)));
  }
  if (phases.classes.size() > kMaxClassesShown) {
    out += fmt::format("  ... and {} more classes of ranks (report.json memory.phases)\n",
                       phases.classes.size() - kMaxClassesShown);
  }
  return out;
}

}  // namespace shardscope::sim
