// What the plan says about the job before its first step: the CUDA under PyTorch
// (training.cuda_version) and how the model reaches the GPU (training.init.device,
// fsdp1.sync_module_states / device_id, zero.zero_init), checked against what each framework
// accepts. The phase itself is simulated from these (lowering/init_program.h).
#include <fmt/format.h>

#include "plan_parser.h"
#include "shardscope/sim/presets/cuda_runtime.h"

namespace shardscope::sim {

InitDevice InitDeviceOf(const Plan& plan) {
  if (plan.training.init_device) return *plan.training.init_device;
  return plan.strategy == Strategy::kFsdp2 ? InitDevice::kMeta : InitDevice::kCpu;
}

std::string_view InitDeviceName(InitDevice device) { return plan_internal::NameOf(plan_internal::kInitDevices, device); }

namespace plan_internal {

Status PlanParser::ResolveInit(const Entry* training, const Entry* strategy_section, Plan* plan) const {
  TrainingConfig& t = plan->training;
  const GpuArch arch = plan->cluster.gpu.arch;
  if (t.cuda_major == 0) {
    const CudaVersion cuda = DefaultCudaFor({t.pytorch_major, t.pytorch_minor}, arch);
    t.cuda_major = cuda.major;
    t.cuda_minor = cuda.minor;
  } else if (const CudaVersion minimum = MinimumCudaFor(arch); CudaVersion{t.cuda_major, t.cuda_minor} < minimum) {
    YAML::Mark mark = training != nullptr ? MarkOf(*training) : YAML::Mark::null_mark();
    if (training != nullptr && training->value.IsMap() && training->value["cuda_version"]) {
      mark = training->value["cuda_version"].Mark();
    }
    return Error(mark, "training.cuda_version",
                 fmt::format("CUDA {} or later on {} ({}: older toolkits build no kernels for it)",
                             ReleaseVersionText(minimum), plan->cluster.gpu.name, GpuArchName(arch)),
                 fmt::format("'{}.{}'", t.cuda_major, t.cuda_minor));
  }
  // Where an error about the init setup points: training.init.device when given, else the
  // strategy's knob, else the training section.
  const auto init_device_mark = [&]() -> YAML::Mark {
    if (training != nullptr && training->value.IsMap() && training->value["init"] &&
        training->value["init"].IsMap() && training->value["init"]["device"]) {
      return training->value["init"]["device"].Mark();
    }
    if (training != nullptr) return MarkOf(*training);
    return strategy_section != nullptr ? MarkOf(*strategy_section) : YAML::Mark::null_mark();
  };
  const InitDevice device = InitDeviceOf(*plan);
  const bool zero = plan->strategy == Strategy::kZero1 || plan->strategy == Strategy::kZero2 ||
                    plan->strategy == Strategy::kZero3;
  if (device == InitDevice::kMeta && plan->strategy == Strategy::kDdp) {
    // DistributedDataParallel.__init__ broadcasts rank 0's parameters (_sync_module_states) and
    // builds gradient buckets from real tensors; it takes no meta module.
    return Error(init_device_mark(), "training.init.device",
                 "cpu or cuda with strategy ddp (DistributedDataParallel broadcasts and buckets real parameters)",
                 "'meta'");
  }
  if (device == InitDevice::kMeta && zero && !plan->zero.zero_init) {
    // deepspeed.initialize moves the module to the GPU (engine._configure_distributed_model:
    // module.to(device)); a model without storage is built under zero.Init instead.
    return Error(init_device_mark(), "training.init.device",
                 "cpu or cuda with DeepSpeed (deepspeed.initialize moves real parameters to the GPU; "
                 "to avoid materializing the model, build it under deepspeed.zero.Init: zero.zero_init: true)",
                 "'meta'");
  }
  if (plan->strategy == Strategy::kFsdp1 && plan->fsdp1.sync_module_states && device == InitDevice::kCpu &&
      !plan->fsdp1.device_id) {
    // torch/distributed/fsdp/_init_utils.py _move_module_to_device / _sync_module_params_and_buffers:
    // "Module has CPU parameters, but sync_module_states=True is specified. This only works for
    // GPU module, please specify `device_id` argument or move the module to GPU before init."
    YAML::Mark mark = init_device_mark();
    if (strategy_section != nullptr && strategy_section->value.IsMap() &&
        strategy_section->value["sync_module_states"]) {
      mark = strategy_section->value["sync_module_states"].Mark();
    }
    return Error(mark, "fsdp1.sync_module_states",
                 "sync_module_states only with a module on the GPU (fsdp1.device_id: true, or training.init.device: "
                 "cuda or meta): FSDP raises for CPU parameters",
                 "true with the module on the CPU and no device_id");
  }
  return Status::Ok();
}

}  // namespace plan_internal
}  // namespace shardscope::sim
