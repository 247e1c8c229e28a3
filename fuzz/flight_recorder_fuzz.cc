// Fuzzes the Flight Recorder reader and analysis: any bytes must give a dump (then an analysis
// and both reports) or an InvalidInput status, never a crash, hang or unbounded allocation.
// The parsed dump is analyzed alone and beside a copy of itself under another rank, so that
// the cross-rank matching runs on fuzzed entries.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "shardscope/analysis/flight_recorder_analysis.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardscope::traces;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto dump = ParseFlightRecorderDump(bytes, "fuzz", 0);
  if (!dump.ok()) {
    if (dump.status().code() != shardscope::StatusCode::kInvalidInput) std::abort();
    return 0;
  }
  std::vector<FlightRecorderDump> dumps = {*dump};
  FlightRecorderAnalysis one = AnalyzeFlightRecorder(dumps);
  FlightRecorderDump other = *dump;
  other.rank = dump->rank == 1 ? 0 : 1;
  dumps.push_back(std::move(other));
  FlightRecorderAnalysis two = AnalyzeFlightRecorder(dumps);
  const size_t total = FlightRecorderText(one).size() + FlightRecorderJsonReport(two).size();
  return total == 0 ? 1 : 0;
}
