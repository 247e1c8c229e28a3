// Reading CUPTI's activity records (CUDA builds only, compiled against CUPTI's headers): the
// records' layout depends on the libcupti that is loaded, not on the headers we were built
// with, so the decode takes the loaded library's API version (cuptiGetVersion).
//
// What each CUPTI release writes (the kinds' "corresponding activity record structure" in
// each release's cupti_activity.h, and DFTracer's per-release table, verified against the
// headers of CUDA 12.2, 12.6, 12.9 and 13.1: dftracer src/dftracer/core/gpu/cuda/cupti):
//   kernel:          CUDA 12.x CUpti_ActivityKernel9, 13.0-13.1 CUpti_ActivityKernel10
//   memcpy:          12.0-12.7 CUpti_ActivityMemcpy5, 12.8+ CUpti_ActivityMemcpy6
//   memset:          CUpti_ActivityMemset4 throughout
//   synchronization: 12.0-12.7 CUpti_ActivitySynchronization, 12.8+ CUpti_ActivitySynchronization2
//   overhead:        12.0-12.5 CUpti_ActivityOverhead (no correlationId), 12.6+ CUpti_ActivityOverhead3
//   runtime/driver API and external correlation: CUpti_ActivityAPI, CUpti_ActivityExternalCorrelation
// Every field read here sits at the same offset in each version (static_asserts in
// cupti_records.cc, against the deprecated structs the CUDA 13 headers keep), so one decode
// reads CUDA 12 and 13 records alike; the one field a version lacks (an overhead's
// correlationId before 12.6) is not read there. A libcupti newer than the headers (13.2's
// CUpti_ActivityKernel11) is read through the same prefix: an assumption (CUPTI has appended
// fields so far), unverified on such a release.
#ifndef SHARDSCOPE_PROFILER_SRC_CUPTI_RECORDS_H_
#define SHARDSCOPE_PROFILER_SRC_CUPTI_RECORDS_H_

#if defined(SHARDSCOPE_HAVE_CUPTI)

#include <cupti.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardscope/base/status.h"
#include "shardscope/profiler/activity.h"

namespace shardscope::profiler {

// The oldest libcupti whose records this build reads: CUDA 12.0's (API version 19,
// cupti_version.h). CUDA 13 numbers its versions xxyyzz (130000 for 13.0).
inline constexpr uint32_t kOldestCuptiApiVersion = 19;
// CUDA 12.6 (API version 24): overhead records carry a correlationId (CUpti_ActivityOverhead3).
inline constexpr uint32_t kCuptiOverheadCorrelationVersion = 24;

struct CuptiRecordLayout {
  uint32_t api_version = 0;
  bool overhead_has_correlation = false;
};

// The layout a libcupti of `api_version` writes; kInvalidInput for one older than CUDA 12.0.
StatusOr<CuptiRecordLayout> CuptiRecordLayoutFor(uint32_t api_version);

// Appends `record` as our record (nothing for a kind we do not read). `api_name` names a
// runtime (driver = false) or driver API call from its callback id.
using CuptiApiNamer = std::function<const std::string&(bool driver, uint32_t cbid)>;
void DecodeCuptiRecord(const CUpti_Activity* record, const CuptiRecordLayout& layout, const CuptiApiNamer& api_name,
                       std::vector<ActivityRecord>& out);

}  // namespace shardscope::profiler

#endif  // SHARDSCOPE_HAVE_CUPTI

#endif  // SHARDSCOPE_PROFILER_SRC_CUPTI_RECORDS_H_
