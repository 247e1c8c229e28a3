// Plan files: the entry points (ParsePlan, LoadPlanFile, the enum names) and the walk of one
// document: which sections are read in which order, and the checks that span sections. Each
// section's reader lives in its own file (sim/plan/README.md lists them); plan_parser.h
// describes how the parser reads YAML.
#include "shardscope/sim/plan/plan.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "plan_parser.h"

namespace shardscope::sim::plan_internal {
namespace {

// Counts documents without building them, stopping at the second. YAML::LoadAll is not used:
// in yaml-cpp 0.7 it never returns on some malformed input (a document "!a,b!" yields
// documents without consuming the input; found by fuzz/plan_loader_fuzz), while Load and a
// bounded number of HandleNextDocument calls do return.
class DiscardEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { last_start_ = mark; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  const YAML::Mark& last_start() const { return last_start_; }

 private:
  YAML::Mark last_start_ = YAML::Mark::null_mark();
};

struct DocumentCount {
  int count = 0;  // 0, 1 or 2 (meaning "2 or more")
  YAML::Mark second_start = YAML::Mark::null_mark();
};

DocumentCount CountDocuments(const std::string& text) {
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  DiscardEvents discard;
  DocumentCount result;
  while (result.count < 2 && parser.HandleNextDocument(discard)) {
    ++result.count;
    if (result.count == 2) result.second_start = discard.last_start();
  }
  return result;
}

}  // namespace

Status PlanParser::ReadStrategy(const Entry& entry, Strategy* out) const {
  if (entry.value.IsScalar()) {
    for (const StrategyAlias& alias : kStrategyAliases) {
      if (alias.name == entry.value.Scalar()) {
        return Error(MarkOf(entry), "strategy", fmt::format("one of {}", EnumNames(kStrategies)),
                     fmt::format("{} ({})", Describe(entry.value), alias.instead));
      }
    }
  }
  return ReadEnum(entry, "strategy", kStrategies, out);
}

// ---- the whole plan -------------------------------------------------------------------------

StatusOr<Plan> PlanParser::Parse(std::string_view text) {
  const std::string owned_text(text);
  const DocumentCount documents = CountDocuments(owned_text);
  if (documents.count == 0) {
    return Status::InvalidInput(fmt::format(
        "{}:1:1: (top level): expected a mapping with keys model, cluster and strategy, got an "
        "empty file",
        source_));
  }
  if (documents.count > 1) {
    return Error(documents.second_start, "(top level)", "one YAML document",
                 "more than one (a second starts here)");
  }
  return ParseRoot(YAML::Load(owned_text), owned_text);
}

StatusOr<Plan> PlanParser::ParseRoot(const YAML::Node& root, const std::string& text) const {
  // The framework config files first: their values join the tree and are read like the
  // plan's own. (A copy of the handle: the tree is this parse's own.)
  SHARDSCOPE_ASSIGN_OR_RETURN(PendingSources pending, ReadSources(YAML::Node(root)));
  SHARDSCOPE_ASSIGN_OR_RETURN(Fields top, ReadMapping(root, root.Mark(), "", kTopKeys));

  SHARDSCOPE_RETURN_IF_ERROR(
      Require(top, "", "model", "a model preset or a mapping of model dimensions"));
  SHARDSCOPE_RETURN_IF_ERROR(
      Require(top, "", "cluster", "a cluster preset or a mapping with 'preset'"));
  SHARDSCOPE_RETURN_IF_ERROR(
      Require(top, "", "strategy", fmt::format("one of {}", EnumNames(kStrategies))));

  Plan plan;
  plan.source = source_;
  plan.contention = DefaultContentionConfig();
  plan.host = DefaultHostConfig();

  // The strategy first: it decides which strategy section is allowed.
  SHARDSCOPE_RETURN_IF_ERROR(ReadStrategy(*top.Find("strategy"), &plan.strategy));
  SHARDSCOPE_RETURN_IF_ERROR(ReadModel(*top.Find("model"), &plan.model));
  SHARDSCOPE_RETURN_IF_ERROR(ReadCluster(*top.Find("cluster"), &plan.cluster, &plan.contention));
  // cluster.calibration is read last: its fitted costs replace the host and contention
  // sections' values.
  std::optional<Entry> calibration;
  if (const Entry* cluster = top.Find("cluster"); cluster->value.IsMap()) {
    for (const auto& pair : cluster->value) {
      if (pair.first.IsScalar() && pair.first.Scalar() == "calibration") {
        calibration = Entry{"calibration", pair.first, pair.second};
      }
    }
  }
  // Config-file values that need the model's hidden size or the world size.
  SHARDSCOPE_RETURN_IF_ERROR(ApplyPendingSources(pending, YAML::Node(root), plan));
  // After the cluster: the dtype is checked against the GPU.
  const Entry* training = top.Find("training");
  // Errors about the workload as a whole point at the training section, or else at the model.
  const YAML::Mark training_mark = MarkOf(training != nullptr ? *training : *top.Find("model"));
  bool dtype_given = false;
  YAML::Mark seq_len_mark = training_mark;
  YAML::Mark dtype_mark = training_mark;
  YAML::Mark kernels_mark = training_mark;
  if (training != nullptr) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadTraining(*training, plan.cluster.gpu, &plan.training,
                                            &dtype_given, &seq_len_mark, &dtype_mark, &kernels_mark));
  }
  SHARDSCOPE_RETURN_IF_ERROR(ResolveKernelChoices(kernels_mark, &plan));
  // After training: the default NCCL is the one its PyTorch release bundles.
  SHARDSCOPE_RETURN_IF_ERROR(ResolveNccl(top.Find("cluster"), &plan));
  // The default dtype must suit the GPU too (bf16 on a V100, say); an explicit one was
  // checked where it was read.
  if (!dtype_given && !DTypeSupported(plan.cluster.gpu, plan.training.dtype)) {
    // Points at the training section, or else at the cluster that chose the GPU.
    return Error(MarkOf(training != nullptr ? *training : *top.Find("cluster")), "training.dtype",
                 ExpectedDType(plan.cluster.gpu),
                 fmt::format("the default {}", Quote(traces::DTypeName(plan.training.dtype))));
  }

  // One strategy section, the chosen strategy's own.
  std::string_view own_section;
  for (const StrategySection& entry : kStrategySections) {
    if (entry.strategy == plan.strategy) own_section = entry.section;
  }
  for (const StrategySection& entry : kStrategySections) {
    const Entry* section = top.Find(entry.section);
    if (section == nullptr || entry.section == own_section) continue;
    return Error(section->key_node.Mark(), entry.section,
                 fmt::format("only the '{}' section", own_section),
                 fmt::format("section '{}' given but strategy is {}", entry.section,
                             StrategyName(plan.strategy)));
  }
  const bool zero = plan.strategy == Strategy::kZero1 || plan.strategy == Strategy::kZero2 ||
                    plan.strategy == Strategy::kZero3;
  if (plan.training.precision == Precision::kPureBf16) {
    const YAML::Node node = training->value["precision"];
    const YAML::Mark mark = node ? node.Mark() : training_mark;
    if (plan.training.dtype != traces::DType::kBFloat16) {
      return Error(mark, "training.precision",
                   "mixed, or training.dtype bf16 (pure_bf16 keeps parameters, gradients and "
                   "optimizer states in bf16)",
                   fmt::format("'pure_bf16' with training.dtype {}", Quote(traces::DTypeName(plan.training.dtype))));
    }
    if (plan.strategy != Strategy::kFsdp2 && plan.strategy != Strategy::kDdp) {
      return Error(mark, "training.precision",
                   fmt::format("mixed with strategy {} (pure_bf16 is modelled for fsdp2 and ddp, "
                               "the way torchtune's recipes shard a bf16 model)",
                               StrategyName(plan.strategy)),
                   "'pure_bf16'");
    }
  }
  if (zero && plan.training.dtype == traces::DType::kFloat8E4M3) {
    // DeepSpeed's precisions are its fp16 and bf16 config sections or fp32
    // (deepspeed/runtime/config.py: get_fp16_enabled, get_bfloat16_enabled; DtypeEnum has
    // fp16, fp32, int8, bf16); ZeRO keeps its flat partitions in that dtype and has no fp8.
    return Error(dtype_mark, "training.dtype",
                 fmt::format("bf16, fp16 or fp32 with strategy {} (DeepSpeed ZeRO has no fp8 "
                             "precision: its config knows fp16, bf16 and fp32)",
                             StrategyName(plan.strategy)),
                 "'fp8'");
  }
  // Every strategy's defaults are resolved (mixed precision, mesh, overlap_comm), so a plan
  // whose strategy a caller changes afterwards still holds consistent values.
  SHARDSCOPE_RETURN_IF_ERROR(ReadFsdp2(top.Find("fsdp2"), plan, &plan.fsdp2));
  SHARDSCOPE_RETURN_IF_ERROR(ReadFsdp1(top.Find("fsdp1"), plan, &plan.fsdp1));
  SHARDSCOPE_RETURN_IF_ERROR(ReadZero(top.Find("zero"), plan, &plan.zero));
  if (const Entry* e = top.Find("ddp")) SHARDSCOPE_RETURN_IF_ERROR(ReadDdp(*e, &plan.ddp));
  SHARDSCOPE_RETURN_IF_ERROR(ResolveInit(training, own_section.empty() ? nullptr : top.Find(own_section), &plan));
  // After the strategy sections: expert parallelism depends on the HSDP mesh, and the
  // checkpoint on fairscale and on expert parallelism.
  if (const Entry* e = top.Find("moe")) SHARDSCOPE_RETURN_IF_ERROR(ReadMoe(*e, plan, &plan.moe));
  if (const Entry* e = top.Find("checkpoint")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadCheckpoint(*e, plan, &plan.checkpoint));
  }
  if (const Entry* e = top.Find("host")) SHARDSCOPE_RETURN_IF_ERROR(ReadHost(*e, &plan.host));
  if (const Entry* e = top.Find("allocator")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadAllocator(*e, plan.cluster.world_size(), &plan.memory));
  }
  SHARDSCOPE_RETURN_IF_ERROR(CheckDeviceCapacity(*top.Find("cluster"), top.Find("allocator"), plan));
  if (const Entry* e = top.Find("expect")) SHARDSCOPE_RETURN_IF_ERROR(ReadExpect(*e, plan.cluster.world_size()));
  // After fsdp1: the policy is Composer's, on torch FSDP1.
  if (const Entry* e = top.Find("oom")) SHARDSCOPE_RETURN_IF_ERROR(ReadOom(*e, plan, &plan.oom));

  // The model's own limits on the workload (seq_len within learned position embeddings).
  Workload workload;
  workload.micro_batch = plan.training.micro_batch_size;
  workload.seq_len = plan.training.seq_len;
  workload.dtype = plan.training.dtype;
  if (Status status = ValidateWorkload(plan.model, workload); !status.ok()) {
    return Status::InvalidInput(
        fmt::format("{}: training.seq_len: {}", Where(seq_len_mark), status.message()));
  }

  // Keeps activation byte counts inside int64_t.
  const double tokens = static_cast<double>(plan.training.seq_len) *
                        static_cast<double>(plan.training.micro_batch_size);
  const double per_token =
      plan.model.layers * (static_cast<double>(plan.model.hidden) +
                           static_cast<double>(plan.model.ffn) * plan.model.experts_per_token) +
      static_cast<double>(plan.model.vocab);
  if (tokens * per_token > kMaxActivationElements) {
    return Error(training_mark, "training",
                 "a micro-batch of at most 2^50 activation elements (seq_len x "
                 "micro_batch_size x per-token width)",
                 fmt::format("about {:.3g}", tokens * per_token));
  }
  if (pending.sliding_window > 0 && plan.training.seq_len > pending.sliding_window) {
    // Mistral's sliding window equals full causal attention only up to the window.
    return Status::InvalidInput(fmt::format(
        "{}: sliding_window: unsupported: a window of {} tokens with training.seq_len {} "
        "(sliding-window attention is not modelled; it is full causal attention only for "
        "sequences up to the window)",
        pending.sliding_window_origin, pending.sliding_window, plan.training.seq_len));
  }
  if (calibration) SHARDSCOPE_RETURN_IF_ERROR(ReadCalibration(*calibration, &plan));
  // Last: its variants are whole plans read like this one.
  if (const Entry* e = top.Find("divergence")) {
    SHARDSCOPE_RETURN_IF_ERROR(ReadDivergence(*e, text, &plan));
  }
  return plan;
}

}  // namespace shardscope::sim::plan_internal

namespace shardscope::sim {

using plan_internal::kImplementations;
using plan_internal::kMaxPlanFileBytes;
using plan_internal::kPrecisions;
using plan_internal::kRmsNormKernels;
using plan_internal::kStrategies;
using plan_internal::NameOf;
using plan_internal::PlanParser;

std::string_view PrecisionName(Precision precision) { return NameOf(kPrecisions, precision); }
std::string_view ModelImplementationName(ModelImplementation implementation) {
  return NameOf(kImplementations, implementation);
}
std::string_view RmsNormKernelName(RmsNormKernel kernel) { return NameOf(kRmsNormKernels, kernel); }
std::string_view CheckpointingName(ActivationCheckpointing ac) { return NameOf(plan_internal::kCheckpointing, ac); }
std::string_view Fsdp1ShardingStrategyName(Fsdp1ShardingStrategy strategy) {
  return NameOf(plan_internal::kFsdp1ShardingStrategies, strategy);
}

std::string_view StrategyName(Strategy strategy) {
  for (const auto& entry : kStrategies) {
    if (entry.value == strategy) return entry.name;
  }
  return "unknown";
}

Workload WorkloadOf(const Plan& plan) {
  Workload w;
  w.micro_batch = plan.training.micro_batch_size;
  w.seq_len = plan.training.seq_len;
  w.dtype = plan.training.dtype;
  w.expert_load = plan.moe.rank_load;
  w.kernels = plan.training.kernels;
  return w;
}

StatusOr<Plan> ParsePlan(std::string_view yaml_text, const std::string& source) {
  try {
    return PlanParser(source).Parse(yaml_text);
  } catch (const YAML::Exception& e) {
    // Syntax errors (ParserException, including yaml-cpp's nesting-depth guard) carry a mark.
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    const int column = e.mark.is_null() ? 1 : e.mark.column + 1;
    return Status::InvalidInput(
        fmt::format("{}:{}:{}: invalid YAML: {}", source, line, column, e.msg));
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("{}: reading the plan failed: {}", source, e.what()));
  } catch (...) {
    return Status::Internal(fmt::format("{}: reading the plan failed", source));
  }
}

StatusOr<Plan> LoadPlanFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return Status::IoError(fmt::format("cannot read plan '{}': {}", path, std::strerror(errno)));
  }
  std::string text;
  std::array<char, 65536> buffer;
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), file)) > 0) {
    text.append(buffer.data(), n);
    if (text.size() > kMaxPlanFileBytes) {
      std::fclose(file);
      return Status::InvalidInput(
          fmt::format("{}:1:1: (top level): expected a plan file of at most {} bytes, got more",
                      path, kMaxPlanFileBytes));
    }
  }
  // fopen succeeds on a directory; the read then fails with EISDIR.
  const bool failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (failed) {
    return Status::IoError(
        fmt::format("cannot read plan '{}': {}", path, std::strerror(read_errno)));
  }
  return ParsePlan(text, path);
}

}  // namespace shardscope::sim
