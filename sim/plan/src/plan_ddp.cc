// The ddp: section: DistributedDataParallel's gradient buckets and no_sync.
#include "plan_parser.h"

namespace shardscope::sim::plan_internal {

Status PlanParser::ReadDdp(const Entry& entry, DdpConfig* out) const {
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields fields,
                              ReadMapping(entry.value, MarkOf(entry), "ddp", kDdpKeys));
  if (const Entry* e = fields.Find("bucket_cap_mb")) {
    SHARDSCOPE_RETURN_IF_ERROR(
        ReadNumber(*e, "ddp.bucket_cap_mb", 0, true, kMaxBucketCapMb, &out->bucket_cap_mb));
    // DistributedDataParallel.__init__ (torch/nn/parallel/distributed.py): the 1 MiB first
    // bucket applies only when bucket_cap_mb is left None (bucket_bytes_cap_default); a
    // bucket_cap_mb given explicitly caps the first bucket too.
    out->first_bucket_mb = out->bucket_cap_mb;
  }
  if (const Entry* e = fields.Find("no_sync")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadBool(*e, "ddp.no_sync", &out->no_sync));
  }
  return Status::Ok();
}

}  // namespace shardscope::sim::plan_internal
