#include "engine/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "engine/plan/memory.h"
#include "engine/plan/reliability.h"
#include "telemetry/pipeline_program.h"

namespace gantry {

namespace {

// The planner's schedule as the backends' profiles name it.
CudaPipeSchedule cuda_pipe_schedule(Schedule s) {
  return s == Schedule::kGpipe          ? CudaPipeSchedule::kGpipe
         : s == Schedule::kZeroBubbleH1 ? CudaPipeSchedule::kZeroBubbleH1
         : s == Schedule::kInterleaved  ? CudaPipeSchedule::kInterleaved
                                        : CudaPipeSchedule::kOneFOneB;
}

// "1.23 ms": a duration in a comm axis's pattern.
std::string plan_ms(double seconds) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f ms", 1e3 * seconds);
  return b;
}

constexpr double kActivationBytes = 2;  // bf16 activations and activation gradients on the wire
constexpr double kSecondsPerDay = 86400;

std::string fail(const std::string& field, long long value, const std::string& rule) {
  return field + " = " + std::to_string(value) + ": " + rule;
}

// The layout with every derived degree filled in, or the first thing wrong with the input.
struct Resolved {
  PlanLayout l;
  int gpus = 0;
  int shard = 1;         // ZeRO shard group (1 without ZeRO)
  int replicas = 1;      // dp / shard
  int global_batch = 0;  // sequences
  int m = 0;             // micro-batches per pipeline per step
  int layers_per_device = 0;
};

Result<Resolved> resolve(const PlanInput& in) {
  Status s = plan_model_validate(in.model);
  if (!s.ok()) return s;
  const PlanModel& md = in.model;
  const ClusterSpec& c = in.cluster;
  const PlanTraining& tr = in.training;
  if (c.gpus < 1) return Status::error(fail("gpus", c.gpus, "allowed >= 1"));
  if (c.gpus_per_node < 1) return Status::error(fail("gpus_per_node", c.gpus_per_node, "allowed >= 1"));
  if (in.engine == EngineKind::kGantryCpu) {
    // The CPU backend's step is priced by its own loop rates; the device gives only its memory.
    if (!(c.gpu.hbm_bytes > 0)) return Status::error("device '" + c.gpu.name + "': memory bytes must be > 0");
    Status rates = plan_cpu_rates_validate(in.cpu);
    if (!rates.ok()) return rates;
  } else {
    if (!(c.gpu.bf16_flops > 0) || !(c.gpu.hbm_bytes > 0) || !(c.gpu.hbm_bw > 0)) {
      return Status::error("gpu '" + c.gpu.name + "': peak FLOP/s, HBM bytes and HBM bandwidth must be > 0");
    }
    if (!(c.gpu.compute_efficiency > 0) || c.gpu.compute_efficiency > 1) {
      return Status::error("gpu compute_efficiency = " + std::to_string(c.gpu.compute_efficiency) +
                           ": allowed (0, 1]");
    }
    if (!(c.intra_bw > 0) || !(c.inter_bw > 0)) {
      return Status::error("intra_bw and inter_bw (bytes/s) must be > 0");
    }
  }

  Resolved r;
  r.l = in.layout;
  PlanLayout& l = r.l;
  r.gpus = c.gpus;
  const int kv_heads = plan_model_kv_heads(md);
  if (l.tp < 1 || md.heads % l.tp != 0 || kv_heads % l.tp != 0 || plan_model_ffn(md) % l.tp != 0) {
    return Status::error(fail("tp", l.tp,
                              "must be >= 1 and divide heads (" + std::to_string(md.heads) + "), kv_heads (" +
                                  std::to_string(kv_heads) + ") and ffn (" +
                                  std::to_string(plan_model_ffn(md)) + ")"));
  }
  if (l.cp < 1 || md.seq % l.cp != 0) {
    return Status::error(fail("cp", l.cp, "must be >= 1 and divide seq (" + std::to_string(md.seq) + ")"));
  }
  if (l.pp < 1 || l.pp > md.layers) {
    return Status::error(fail("pp", l.pp, "allowed 1..layers (" + std::to_string(md.layers) + ")"));
  }
  r.layers_per_device = (md.layers + l.pp - 1) / l.pp;
  if (l.vp < 1 || l.vp > r.layers_per_device || (l.vp > 1 && l.pp == 1)) {
    return Status::error(
        fail("vp", l.vp,
             "allowed 1, or 2..layers per stage (" + std::to_string(r.layers_per_device) + ") with pp > 1"));
  }
  const long long model_parallel = static_cast<long long>(l.tp) * l.cp * l.pp;
  if (c.gpus % model_parallel != 0) {
    return Status::error("gpus = " + std::to_string(c.gpus) +
                         ": must be a multiple of tp·cp·pp = " + std::to_string(model_parallel));
  }
  const int dp = static_cast<int>(c.gpus / model_parallel);
  if (l.dp != 0 && l.dp != dp) {
    return Status::error(
        fail("dp", l.dp,
             "tp·cp·pp·dp must equal gpus (" + std::to_string(c.gpus) + "), so dp = " + std::to_string(dp)));
  }
  l.dp = dp;
  if (l.zero < 0 || l.zero > 3) return Status::error(fail("zero", l.zero, "allowed 0, 1, 2, 3"));
  if (l.hsdp != 0 && (l.zero < 1 || l.hsdp < 1 || dp % l.hsdp != 0)) {
    return Status::error(fail(
        "hsdp", l.hsdp,
        "allowed 0 (shard over all of dp), or with zero >= 1 a divisor of dp (" + std::to_string(dp) + ")"));
  }
  r.shard = l.zero >= 1 ? (l.hsdp > 0 ? l.hsdp : dp) : 1;
  r.replicas = dp / r.shard;
  if (l.micro_batch < 1) return Status::error(fail("micro_batch", l.micro_batch, "allowed >= 1"));
  const long long per_step = static_cast<long long>(dp) * l.micro_batch;
  long long gb = tr.global_batch;
  if (gb == 0) {
    const long long want = ((1LL << 20) + md.seq - 1) / md.seq;
    gb = (want + per_step - 1) / per_step * per_step;
  }
  if (gb < per_step || gb % per_step != 0) {
    return Status::error(fail("global_batch", gb,
                              "must be a multiple of dp × micro_batch = " + std::to_string(dp) + " × " +
                                  std::to_string(l.micro_batch)));
  }
  if (gb > 1000000000) return Status::error(fail("global_batch", gb, "allowed up to 1e9 sequences"));
  r.global_batch = static_cast<int>(gb);
  r.m = static_cast<int>(gb / per_step);
  if (l.schedule == Schedule::kInterleaved && l.vp == 1) {
    return Status::error("schedule = interleaved: needs vp > 1");
  }
  if (l.schedule == Schedule::kZeroBubbleH1 && l.vp > 1) {
    // As the engine (pipeline_check): ZB-H1 runs one model chunk per rank.
    return Status::error(fail("vp", l.vp, "schedule zbh1 runs one model chunk per rank (vp 1)"));
  }
  if (l.vp > 1) {
    l.schedule = Schedule::kInterleaved;
    if (r.m % l.pp != 0) {
      // Megatron's interleaved schedule runs micro-batches in groups of p.
      return Status::error(
          fail("micro-batches per step", r.m,
               "the interleaved schedule needs a multiple of pp (" + std::to_string(l.pp) + ")"));
    }
  }
  if (l.tp == 1) l.sequence_parallel = false;
  if (tr.weight_bytes < 1 || tr.grad_bytes < 1 || tr.master_bytes < 0 || tr.optimizer_bytes < 0) {
    return Status::error("bytes per parameter: weights and grads >= 1, master and optimizer >= 0");
  }
  if (tr.tokens < 0 || tr.checkpoint_bytes_per_param < 0 || tr.checkpoint_write_bw < 0 || tr.restart_s < 0) {
    return Status::error("tokens, checkpoint bytes, write bandwidth and restart time must be >= 0");
  }
  if (!(tr.tp_overlap >= 0) || tr.tp_overlap > 1) {
    return Status::error("tp_overlap = " + std::to_string(tr.tp_overlap) + ": allowed 0..1");
  }
  if (!(in.cpu_background >= 0)) {
    return Status::error("cpu_background = " + std::to_string(in.cpu_background) + ": allowed >= 0");
  }
  if (in.cpu_cores < 0)
    return Status::error(fail("cpu_cores", in.cpu_cores, "allowed >= 0 (0 = one per thread)"));
  return r;
}

// An engine profile runs what the engine can: no recomputation, the engine's own
// attention (flash kernels on CUDA, the materialised softmax on the CPU) and its dtypes. Returns the
// input as that engine runs it, or what the engine cannot do.
Result<PlanInput> engine_input(const PlanInput& in) {
  if (in.engine == EngineKind::kGeneric) return in;
  Status s = plan_engine_validate(in.engine, in.model);
  if (!s.ok()) return s;
  const std::string who = std::string("engine ") + engine_kind_name(in.engine) + ": ";
  const PlanLayout& l = in.layout;
  // The engines' tables are known per rank for data, tensor and pipeline parallel layouts (issue 17: a dp
  // rank holds the whole table or, on CUDA under ZeRO, its shard; a tp rank its share; a stage its blocks
  // and slots, under interleaving each chunk's; under ZeRO a dp rank its shard on both backends); cp and
  // hsdp are not in them.
  if (in.engine == EngineKind::kGantryCpu && (l.cp != 1 || l.hsdp != 0)) {
    return Status::error(who +
                         "profiles dp (zero 0-3), tp and pp layouts (cp and hsdp are not in its table)");
  }
  if (in.engine == EngineKind::kGantryCuda && (l.cp != 1 || l.hsdp != 0)) {
    return Status::error(who +
                         "profiles dp (zero 0-3), tp and pp layouts (cp and hsdp are not in its table)");
  }
  if (l.recompute != Recompute::kNone) return Status::error(who + "keeps every activation (recompute none)");
  if (in.engine == EngineKind::kGantryCpu && in.training.tp_overlap != 0) {
    return Status::error("tp_overlap = " + std::to_string(in.training.tp_overlap) + ": " + who +
                         "waits for every tensor-parallel collective (allowed 0)");
  }
  PlanInput out = in;
  PlanTraining& t = out.training;
  if (in.engine == EngineKind::kGantryCuda) {
    if (!l.flash_attention)
      return Status::error(who + "always runs its flash attention kernels (no --no-flash)");
    out.layout.sequence_parallel = false;  // its tensor parallel all-reduces whole activations
    t.weight_bytes = 2;                    // the bf16 copy the kernels read
    t.grad_bytes = 4;
    t.master_bytes = 4;
  } else {
    out.layout.flash_attention = false;    // the CPU reference stores the (B, NH, T, T) probabilities
    out.layout.sequence_parallel = false;  // its tensor parallel all-reduces whole activations
    // MFU on the CPU is against the engine's own forward matmul rate, the nearest thing it has to a peak.
    out.cluster.gpu.bf16_flops = in.cpu.dot_flops;
    out.cluster.gpu.compute_efficiency = 1;
    t.weight_bytes = 4;  // fp32 parameters are their own master copy
    t.grad_bytes = 4;
    t.master_bytes = 0;
  }
  t.optimizer_bytes = 8;
  return out;
}

// Parameters the GPU of pipeline stage `stage` owns (one tp rank), before ZeRO sharding.
uint64_t params_on_stage(const PlanModel& m, const Resolved& r, int stage) {
  const uint64_t d = static_cast<uint64_t>(m.hidden);
  const uint64_t tp = static_cast<uint64_t>(r.l.tp);
  const uint64_t vocab_rows = (static_cast<uint64_t>(m.vocab) + tp - 1) / tp;  // vocabulary-parallel, padded
  const ParamCounts n = plan_param_counts(m);
  uint64_t p = static_cast<uint64_t>(r.layers_per_device) * plan_layer_params_per_rank(m, r.l.tp);
  if (stage == 0) p += vocab_rows * d + n.positions;
  if (stage == r.l.pp - 1) {
    p += n.final_norm;
    // An untied head, or (tied, pp > 1) the copy of the embedding the last stage keeps for the output layer.
    if (!m.tied_embeddings || r.l.pp > 1) p += vocab_rows * d;
  }
  return p;
}

struct StageMemory {
  MemoryBuckets b;
  double in_flight = 0;
};

StageMemory stage_memory(const PlanInput& in, const Resolved& r, int stage, double layer_bytes,
                         const ActivationShape& shape) {
  const PlanModel& m = in.model;
  const PlanTraining& tr = in.training;
  const PlanLayout& l = r.l;
  const double p = static_cast<double>(params_on_stage(m, r, stage));
  StageMemory s;
  s.b.weights = p * tr.weight_bytes / (l.zero >= 3 ? r.shard : 1);
  s.b.gradients = p * tr.grad_bytes / (l.zero >= 2 ? r.shard : 1);
  s.b.optimizer = p * (tr.master_bytes + tr.optimizer_bytes) / (l.zero >= 1 ? r.shard : 1);

  s.in_flight = plan_microbatches_in_flight(l.schedule, l.pp, l.vp, r.m, stage);
  double act = s.in_flight * r.layers_per_device * layer_bytes;
  act += plan_activation_recompute_working_bytes(m, shape);
  if (stage == 0) act += s.in_flight * plan_activation_embedding_bytes(m, shape);
  if (stage == l.pp - 1) {
    const double outputs_in_flight = l.schedule == Schedule::kGpipe ? r.m : 1;
    act += outputs_in_flight * plan_activation_output_bytes(m, shape);
  }
  s.b.activations = act;

  double buf = tr.runtime_reserved_bytes;
  if (l.dp > 1 && l.zero < 3) buf += 2 * tr.bucket_bytes;
  if (l.zero >= 3 && r.shard > 1) {
    // FSDP-style: the layer being computed and the one prefetched, gathered, plus one layer's full gradient
    // before its reduce-scatter.
    const double layer = static_cast<double>(plan_layer_params_per_rank(m, l.tp));
    buf += 2 * layer * tr.weight_bytes + layer * tr.grad_bytes;
  }
  if (l.pp > 1) {
    // One activation to send and one to receive.
    buf += 2 * kActivationBytes * l.micro_batch * (static_cast<double>(m.seq) / l.cp) * m.hidden;
  }
  s.b.buffers = buf;
  return s;
}

// ---- gantry-cpu's step: the CPU backend's loops at the measured rates, its Gloo collectives over loopback
// (alpha-beta, cluster.h's ring model with the rates' latency and bandwidth), the pipeline's fill and drain,
// and the host's cores shared by every rank's threads.
//
// Per micro-batch, rank (dp, pp stage, tp) runs its stage's forward and backward (plan_cpu_stage_work) and
// waits for its collectives, none overlapped (the backend blocks on each): tp all-reduces of the (N, C)
// activations, 1 for the embedding, 4 per block and 1 for the final norm's input gradient, and the
// vocab-parallel cross-entropy's two all-gathers (row maxima; sums and target logits); pp, a blocking send
// of the activation forward and of its gradient back at every stage boundary. Per step: the first stage
// adds the classifier's weight gradient of each micro-batch after the schedule (the last stage sends it the
// final norm's output and the logits' gradient); the dp all-reduce of the gradients in buckets; the loss
// and the gradient norm reduced over dp, pp and tp; AdamW over the rank's parameters.
//
// The step with a core per thread: the pipeline's m micro-batches at the slowest rank's pace plus the other
// ranks' share of the fill and drain, divided by v under interleaving (m·T_max + (ΣT − T_max)/v: at equal
// stages (m + (p − 1)/v)·T, the bubble (p − 1)/(v·m + p − 1)) and by 3 under ZB-H1, then the tail, the dp
// reduction and the optimizer. With fewer cores than threads, never less than the host's CPU work over its
// cores (the collectives' waits, which take no CPU, added).
void cpu_step_time(const PlanInput& in, const Resolved& r, Plan* p) {
  const PlanModel& md = in.model;
  const PlanLayout& l = r.l;
  const CpuRates& rates = in.cpu;
  const GroupLink link{.bw = rates.comm_bw, .latency_s = rates.comm_latency_s, .crosses_nodes = false};
  const int mb = l.micro_batch;
  const double m = r.m;
  const double act_bytes = 4.0 * mb * md.seq * md.hidden;  // an (N, C) fp32 activation
  const int chunks = l.pp > 1 ? l.vp : 1;
  const int virtual_stages = l.pp * chunks;
  const std::vector<int> layers = plan_cpu_pipeline_layers(md, virtual_stages);

  // One tp all-reduce and the cross-entropy's gathers (tp > 1).
  const double tp_ar = plan_collective_seconds(Collective::kAllReduce, act_bytes, l.tp, link);
  const double tp_ce = plan_collective_seconds(Collective::kAllGather, 4.0 * mb * md.seq * l.tp, l.tp, link) +
                       plan_collective_seconds(Collective::kAllGather, 12.0 * mb * md.seq * l.tp, l.tp, link);
  const double p2p = plan_collective_seconds(Collective::kSendRecv, act_bytes, 2, link);
  // The host CPU one rank's collective costs (its kernel's socket work, Gloo's thread): per ring step it
  // takes and per byte it sends (a send/recv pair, one step between its two ranks).
  auto coll_cpu = [&](Collective k, double bytes, int n) {
    if (n <= 1 || bytes <= 0) return 0.0;
    double ring_steps = 1;
    if (k == Collective::kAllReduce) ring_steps = 2.0 * (n - 1);
    if (k == Collective::kAllGather || k == Collective::kReduceScatter) ring_steps = n - 1;
    return ring_steps * rates.comm_cpu_step_s + bytes * plan_bus_factor(k, n) * rates.comm_cpu_byte_s;
  };
  const double tp_ar_cpu = coll_cpu(Collective::kAllReduce, act_bytes, l.tp);
  const double tp_ce_cpu = coll_cpu(Collective::kAllGather, 4.0 * mb * md.seq * l.tp, l.tp) +
                           coll_cpu(Collective::kAllGather, 12.0 * mb * md.seq * l.tp, l.tp);
  const double p2p_cpu = coll_cpu(Collective::kSendRecv, act_bytes, 2);

  // Per micro-batch, each pp rank: compute (its chunks' loops) and waits (its collectives).
  std::vector<double> compute(l.pp, 0), waits(l.pp, 0), params(l.pp, 0), opt_calls(l.pp, 0);
  std::vector<double> tp_wait(l.pp, 0), tp_calls(l.pp, 0), tp_bytes(l.pp, 0), pp_sends(l.pp, 0);
  std::vector<double> coll_cpu_mb(l.pp, 0), collectives(l.pp, 0);  // per micro-batch, one rank of the stage
  std::vector<CpuStep> steps(l.pp);
  for (int v = 0; v < virtual_stages; ++v) {
    const int rank = v % l.pp;
    const bool first = v == 0, last = v == virtual_stages - 1;
    const CpuWork w = plan_cpu_stage_work(md, mb, l.tp, layers[v], first, last);
    const CpuStep s = plan_cpu_step(w, rates, 1);
    const double optimizer_dispatch = w.optimizer_parallel_calls * rates.parallel_for_s;  // once a step
    compute[rank] += s.total() - s.optimizer_s - optimizer_dispatch;
    params[rank] += w.params;
    opt_calls[rank] += w.optimizer_parallel_calls;
    CpuStep& acc = steps[rank];
    acc.matmul_s += s.matmul_s, acc.attention_s += s.attention_s, acc.elementwise_s += s.elementwise_s;
    acc.dispatch_s += s.dispatch_s - optimizer_dispatch;
    if (l.tp > 1) {
      const double calls = (first ? 1 : 0) + 4.0 * layers[v] + (last ? 1 : 0);
      tp_wait[rank] += calls * tp_ar + (last ? tp_ce : 0);
      tp_calls[rank] += calls;
      tp_bytes[rank] += calls * act_bytes + (last ? 16.0 * mb * md.seq * l.tp : 0);
      coll_cpu_mb[rank] += calls * tp_ar_cpu + (last ? tp_ce_cpu : 0);
      collectives[rank] += calls + (last ? 2 : 0);
    }
    const double sends = (first ? 0 : 1) + (last ? 0 : 1);  // the gradient back, the activation forward
    pp_sends[rank] += sends;
    coll_cpu_mb[rank] += sends * p2p_cpu;
    collectives[rank] += sends;
    waits[rank] = tp_wait[rank] + pp_sends[rank] * p2p;
  }
  // The host's cores: every rank's threads share them with the background's runnable threads (other work on
  // the host), as the kernel's fair scheduler does: each runnable thread gets K / (runnable threads) of a
  // core, at most one. Alone (a pipeline rank whose neighbours wait), a rank's threads compete with the
  // background only.
  const int ranks = std::min(in.cluster.gpus, in.cluster.gpus_per_node);
  const double threads = static_cast<double>(ranks) * rates.threads;
  const double background = in.cpu_background;
  const double cores = in.cpu_cores > 0 ? in.cpu_cores : threads + background;
  const double lone = std::min(1.0, cores / (background + rates.threads));  // a core share, one rank running
  const double all = std::min(1.0, cores / (background + threads));         // every rank running
  p->cpu_share = (background + threads) / cores;

  std::vector<double> per_mb(l.pp);
  int slowest = 0;
  double sum = 0;
  for (int k = 0; k < l.pp; ++k) {
    per_mb[k] = compute[k] / lone + waits[k];
    sum += per_mb[k];
    if (per_mb[k] > per_mb[slowest]) slowest = k;
  }
  const double t_max = per_mb[slowest];
  // The other ranks' share of the fill and drain, 1/k of it (k: v interleaved, 3 under ZB-H1, whose deferred
  // weight passes run in it; the stage's work T already holds them, the split adds no FLOPs).
  const double pipeline = m * t_max + (sum - t_max) / plan_bubble_divisor(l.schedule, chunks);

  // After the schedule (pp > 1): the first stage's classifier weight gradients, the tie's transfers.
  double tail_compute = 0, tail_wait = 0, tail_cpu = 0;
  if (l.pp > 1) {
    tail_compute = m * plan_cpu_classifier_wgrad_flops(md, mb, l.tp) / rates.axpy_flops;
    const double tie_bytes = 4.0 * mb * md.seq * (md.hidden + static_cast<double>(md.vocab) / l.tp);
    const double wte_bytes = 4.0 * md.vocab / l.tp * md.hidden;
    tail_wait = m * plan_collective_seconds(Collective::kSendRecv, tie_bytes, 2, link) +
                plan_collective_seconds(Collective::kSendRecv, wte_bytes, 2, link);
    tail_cpu =
        m * coll_cpu(Collective::kSendRecv, tie_bytes, 2) + coll_cpu(Collective::kSendRecv, wte_bytes, 2);
  }
  // Per step: AdamW (the costliest rank), the dp collectives, the small reductions of the loss and the norm
  // (one all-reduce per axis that has more than one rank, two over pp). Under ZeRO 1-3 a dp rank's AdamW
  // and norm run over its shard, about 1/dp of the parameters (ZeroHostState::adamw on the owned segments).
  const double shard = l.zero >= 1 ? l.dp : 1;
  double opt = 0, opt_total = 0;
  for (int k = 0; k < l.pp; ++k) {
    const double o = params[k] / shard / rates.optimizer_params + opt_calls[k] * rates.parallel_for_s;
    opt = std::max(opt, o);
    opt_total += o;
  }
  // The dp collectives as ZeroHostState runs them, per bucket of train.dp_bucket_mb: ZeRO 0 an all-reduce on
  // the last micro-batch; 1 a reduce-scatter there and an all-gather of the updated shards after AdamW; 2 a
  // reduce-scatter every micro-batch, then the all-gather; 3 a reduce-scatter every micro-batch, and each
  // block's parameters all-gathered before its forward and again before its backward (the embeddings and
  // final norm once a step). Waits, as the other axes' (its communication thread hides some of them).
  const double grad_bytes = 4.0 * params[slowest];
  const double buckets = std::max(1.0, std::ceil(grad_bytes / in.training.bucket_bytes));
  const double bucket = grad_bytes / buckets;
  double dp_s = 0, dp_cpu = 0, dp_calls = 0, dp_bytes = 0;
  auto dp_collective = [&](Collective k, double bytes, double times) {
    dp_bytes += times * bytes;
    dp_s += times * plan_collective_seconds(k, bytes, l.dp, link);
    dp_cpu += times * coll_cpu(k, bytes, l.dp);
    dp_calls += times;
  };
  std::string dp_pattern = "Gloo all-reduce of the gradients per step";
  if (l.dp > 1 && l.zero == 0) dp_collective(Collective::kAllReduce, bucket, buckets);
  if (l.dp > 1 && l.zero >= 1) {
    dp_collective(Collective::kReduceScatter, bucket, (l.zero >= 2 ? m : 1) * buckets);
    dp_pattern =
        std::string("Gloo reduce-scatter of the gradients ") + (l.zero >= 2 ? "per micro-batch" : "per step");
    if (l.zero <= 2) {
      dp_collective(Collective::kAllGather, bucket, buckets);
      dp_pattern += " + all-gather of the updated shards";
    } else {
      double blocks = 0;
      for (int v = slowest; v < virtual_stages; v += l.pp) blocks += layers[static_cast<size_t>(v)];
      const double block_bytes = 4.0 * static_cast<double>(plan_layer_params_per_rank(md, l.tp));
      dp_collective(Collective::kAllGather, block_bytes, 2 * m * blocks);
      const double ends = grad_bytes - blocks * block_bytes;  // the embeddings, the final norm
      if (ends > 0) dp_collective(Collective::kAllGather, ends, 1);
      dp_pattern += " + all-gather of each block's parameters per micro-batch, forward and backward";
    }
  }
  const double small = (l.dp > 1 ? plan_collective_seconds(Collective::kAllReduce, 8, l.dp, link) : 0) +
                       (l.tp > 1 ? plan_collective_seconds(Collective::kAllReduce, 8, l.tp, link) : 0) +
                       (l.pp > 1 ? 2 * plan_collective_seconds(Collective::kAllReduce, 8, l.pp, link) : 0);
  // Their host CPU on one rank, and how many blocking collectives a step of the slowest rank issues.
  const double step_coll_cpu = (l.dp > 1 ? dp_cpu + coll_cpu(Collective::kAllReduce, 8, l.dp) : 0) +
                               coll_cpu(Collective::kAllReduce, 8, l.tp) +
                               2 * coll_cpu(Collective::kAllReduce, 8, l.pp);
  const double step_collectives =
      (l.dp > 1 ? dp_calls + 1 : 0) + (l.tp > 1 ? 1 : 0) + (l.pp > 1 ? 2 + m + 1 : 0);  // + the tail's sends

  double rank_waits = 0;  // what one micro-batch's collectives cost the slowest rank
  for (int k = 0; k < l.pp; ++k) rank_waits = std::max(rank_waits, waits[k]);
  const double one_core_each = pipeline + (tail_compute + opt) / lone + tail_wait + dp_s + small;
  double all_compute = 0, all_coll_cpu = 0, rank_coll_cpu = 0;
  for (int k = 0; k < l.pp; ++k) {
    all_compute += m * compute[k];
    all_coll_cpu += m * coll_cpu_mb[k];
    rank_coll_cpu = std::max(rank_coll_cpu, coll_cpu_mb[k]);
  }
  // Every rank's CPU seconds (a rank's work times its threads, and its collectives' kernel and Gloo work),
  // over the cores the job's threads get; the waits on top, less the CPU the collectives spend inside them
  // (counted with the work): with a core each that CPU is the wait's own, with fewer it is the others'.
  const double per_stage = static_cast<double>(ranks) / l.pp;  // ranks running each pp stage
  const double coll_seconds = (all_coll_cpu + tail_cpu) * per_stage + step_coll_cpu * ranks;
  const double cpu_seconds =
      (all_compute + tail_compute + opt_total) * per_stage * rates.threads + coll_seconds;
  const double step_waits = tail_wait + dp_s + small, step_wait_cpu = tail_cpu + step_coll_cpu;
  const double shared = cpu_seconds / (threads * all) + m * std::max(0.0, rank_waits - rank_coll_cpu) +
                        std::max(0.0, step_waits - step_wait_cpu);
  p->step_s = std::max(one_core_each, shared);
  p->cpu_oversubscription = 1 / all;
  p->cpu_collectives = m * collectives[slowest] + step_collectives;
  p->cpu_comm_cpu_s = coll_seconds;
  p->cpu_host_cpu_s = cpu_seconds;
  CpuStep& st = p->cpu_step;
  st = steps[slowest];
  st.matmul_s *= m, st.attention_s *= m, st.elementwise_s *= m, st.dispatch_s *= m;
  st.matmul_s += tail_compute;
  st.optimizer_s = opt;
  p->optimizer_s = opt / lone;
  p->compute_s = m * compute[slowest] / lone + tail_compute / lone;
  p->bubble_s = l.pp > 1 ? pipeline - m * t_max : 0;
  p->exposed_comm_s = m * waits[slowest] + tail_wait + dp_s + small;
  if (p->step_s > one_core_each) p->compute_s = p->step_s - p->exposed_comm_s - p->optimizer_s - p->bubble_s;

  // The axes' communication as the CPU runs it (none hidden).
  p->comm.clear();
  auto axis = [&](const char* name, int group, std::string pattern, double bytes, double seconds) {
    CommAxis a;
    a.axis = name;
    a.group = group;
    a.pattern = std::move(pattern);
    a.bus_bw = link.bw;
    a.bytes = bytes;
    a.seconds = seconds;
    a.exposed_s = seconds;
    p->comm.push_back(a);
  };
  if (l.tp > 1) {
    axis("tp", l.tp,
         "Gloo all-reduce of (N, C) x" + std::to_string(static_cast<int>(tp_calls[slowest])) +
             (slowest == l.pp - 1 ? " + 2 all-gathers (cross-entropy)" : "") +
             " per micro-batch (the slowest stage's), not overlapped",
         m * tp_bytes[slowest], m * tp_wait[slowest]);
  }
  if (l.pp > 1) {
    axis("pp", l.pp, "Gloo send/recv of (N, C), blocking, at every stage boundary (the slowest stage's)",
         m * pp_sends[slowest] * act_bytes, m * pp_sends[slowest] * p2p + tail_wait);
  }
  if (l.dp > 1) axis("dp", l.dp, dp_pattern, dp_bytes, dp_s);
}

}  // namespace

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Result<Recompute> recompute_parse(std::string_view s) {
  if (s == "none") return Recompute::kNone;
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  return Status::error("recompute '" + std::string(s) + "': allowed none, selective, full");
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kZeroBubbleH1:
      return "zbh1";
  }
  return "?";
}

Result<Schedule> schedule_parse(std::string_view s) {
  if (s == "gpipe") return Schedule::kGpipe;
  if (s == "1f1b") return Schedule::k1F1B;
  if (s == "zbh1") return Schedule::kZeroBubbleH1;
  return Status::error("schedule '" + std::string(s) +
                       "': allowed gpipe, 1f1b, zbh1 (vp > 1 makes a layout interleaved)");
}

const char* flop_convention_name(FlopConvention c) {
  return c == FlopConvention::kGantry ? "gantry" : "megatron";
}

double plan_model_flops_per_token(const PlanModel& m, FlopConvention convention) {
  const FlopsPerToken f = plan_flops_per_token(m);
  return convention == FlopConvention::kGantry ? f.gantry : f.megatron;
}

double plan_hardware_flops_per_token(const PlanModel& m, Recompute r, FlopConvention convention) {
  double f = plan_model_flops_per_token(m, convention);
  if (r == Recompute::kNone) return f;
  if (convention == FlopConvention::kMegatron) {
    const ForwardFlops fw = plan_forward_flops_per_token(m);
    if (r == Recompute::kFull) return f + m.layers * (fw.layer_gemm + fw.layer_attn);
    return f + 3.0 * m.layers * fw.layer_attn;
  }
  const double causal_attn = 2.0 * m.layers * static_cast<double>(m.hidden) * m.seq;
  if (r == Recompute::kFull) {
    return f + 2.0 * m.layers * static_cast<double>(plan_param_counts(m).per_layer) + causal_attn;
  }
  return f + causal_attn;
}

Utilization plan_utilization(const PlanModel& m, Recompute r, double global_batch, double step_s, int gpus,
                             double peak_flops, FlopConvention convention) {
  Utilization u;
  const double tokens = global_batch * m.seq;
  u.model_flops_per_step = plan_model_flops_per_token(m, convention) * tokens;
  u.hardware_flops_per_step = plan_hardware_flops_per_token(m, r, convention) * tokens;
  const double denom = step_s * gpus * peak_flops;
  if (denom > 0) {
    u.mfu = u.model_flops_per_step / denom;
    u.hfu = u.hardware_flops_per_step / denom;
  }
  return u;
}

double plan_tp_exposed_seconds(double comm_s, double product_s, double overlap) {
  return comm_s - std::min(comm_s, std::max(0.0, overlap) * std::max(0.0, product_s));
}

Result<Plan> plan_evaluate(const PlanInput& input) {
  Result<PlanInput> engine_in = engine_input(input);
  if (!engine_in.ok()) return engine_in.status();
  const PlanInput& in = engine_in.value();
  Result<Resolved> res = resolve(in);
  if (!res.ok()) return res.status();
  const Resolved& r = res.value();
  const PlanModel& md = in.model;
  const ClusterSpec& c = in.cluster;
  const PlanTraining& tr = in.training;
  const PlanLayout& l = r.l;

  Plan p;
  p.layout = l;
  p.gpus = c.gpus;
  p.nodes = plan_nodes(c);
  p.global_batch = r.global_batch;
  p.micro_batches = r.m;
  p.counts = plan_param_counts(md);
  p.params = p.counts.total;

  // ---- Memory: the first stage holds the most activations, the last the output layer; take the heavier.
  const ActivationShape shape{.micro_batch = l.micro_batch,
                              .tp = l.tp,
                              .cp = l.cp,
                              .sequence_parallel = l.sequence_parallel,
                              .recompute = l.recompute,
                              .flash_attention = l.flash_attention};
  p.activation_layer_bytes = plan_activation_layer_bytes(md, shape);
  for (int stage : {0, l.pp - 1}) {
    StageMemory sm = stage_memory(in, r, stage, p.activation_layer_bytes, shape);
    if (stage == 0 || sm.b.total() > p.memory.total()) {
      p.memory = sm.b;
      p.memory_stage = stage;
      p.microbatches_in_flight = sm.in_flight;
      p.params_on_gpu = params_on_stage(md, r, stage);
    }
  }
  if (in.engine != EngineKind::kGeneric) {
    // The backends allocate everything from their tables (a pipeline stage's slots during its first step);
    // nothing else is live. Every stage's rank (dp rank 0's), the heaviest as the plan's memory; under ZeRO
    // 1-3 every dp rank's total too (up to kDpRanksListed). Interleaved, a rank's vp chunks with their own
    // slots each.
    const CudaPipeSchedule sched = cuda_pipe_schedule(l.schedule);
    const int vp = l.pp > 1 ? l.vp : 1;
    auto rank_memory = [&](int stage, int dp_rank) {
      const CudaDataParallelPlan dpp{
          .dp = l.dp, .rank = dp_rank, .zero = l.zero, .bucket_bytes = in.training.dp_bucket_bytes};
      if (in.engine == EngineKind::kGantryCuda)
        return plan_cuda_rank_memory(md, l.micro_batch, l.tp, l.pp, stage, r.m, sched, dpp, vp);
      if (l.pp > 1)
        return plan_cpu_pipeline_memory(md, l.micro_batch, l.tp, l.pp, stage, r.m, sched, dpp, vp);
      return plan_cpu_rank_memory(md, l.micro_batch, l.tp, dpp);
    };
    // Each rank's blocks: its chunks' (virtual stages stage, stage + pp, ...) of the backend's partition.
    const std::vector<int> virtual_layers = l.pp == 1 ? std::vector<int>{md.layers}
                                            : in.engine == EngineKind::kGantryCuda
                                                ? plan_cuda_pipeline_layers(md, l.pp * vp)
                                                : plan_cpu_pipeline_layers(md, l.pp * vp);
    for (int stage = 0; stage < l.pp; ++stage) {
      Result<EngineMemory> em = rank_memory(stage, 0);
      if (!em.ok()) return em.status();
      const EngineMemory& e = em.value();
      Plan::StageMemory sm;
      sm.stage = stage;
      sm.layers = 0;
      for (size_t v = static_cast<size_t>(stage); v < virtual_layers.size(); v += static_cast<size_t>(l.pp))
        sm.layers += virtual_layers[v];
      sm.memory = MemoryBuckets{.weights = static_cast<double>(e.weights),
                                .gradients = static_cast<double>(e.gradients),
                                .optimizer = static_cast<double>(e.optimizer),
                                .activations = static_cast<double>(e.activations),
                                .buffers = static_cast<double>(e.buffers)};
      sm.backend_bytes = static_cast<double>(e.backend_bytes);
      // Under ZeRO the dp ranks' shards differ by an element or an AdamW chunk: each one's figure.
      const bool sharded = l.zero >= 1 && l.dp > 1;
      for (int k = 0; sharded && l.dp <= Plan::kDpRanksListed && k < l.dp; ++k) {
        Result<EngineMemory> ek = k == 0 ? em : rank_memory(stage, k);
        if (!ek.ok()) return ek.status();
        sm.dp_rank_totals.push_back(static_cast<double>(ek->total));
        sm.dp_rank_backend_bytes.push_back(static_cast<double>(ek->backend_bytes));
      }
      sm.microbatches_in_flight = e.in_flight;
      double layer_bytes = 0;
      for (const EngineAllocation& a : e.allocations) {
        if (l.pp == 1 && a.bucket == MemoryBucket::kActivations &&
            a.count == static_cast<uint64_t>(md.layers) && a.name.rfind("layer.", 0) == 0) {
          layer_bytes += static_cast<double>(a.bytes_each);
        }
      }
      p.stage_memory.push_back(sm);
      if (stage > 0 && static_cast<double>(e.total) <= p.memory.total()) continue;
      p.memory = sm.memory;
      p.memory_stage = stage;
      p.backend_bytes = sm.backend_bytes;
      p.allocations = e.allocations;
      p.activation_layer_bytes = layer_bytes;
      p.microbatches_in_flight = sm.microbatches_in_flight;
    }
  }
  p.engine = in.engine;
  p.hbm_bytes = c.gpu.hbm_bytes;
  p.fits = p.memory.total() <= p.hbm_bytes;

  // ---- Compute per micro-batch on the slowest rank (the generic model: the last stage, with the output
  // layer).
  const double peak = c.gpu.bf16_flops * c.gpu.compute_efficiency;
  const double tokens_mb = static_cast<double>(l.micro_batch) * md.seq / l.cp;  // per device
  const ForwardFlops fw = plan_forward_flops_per_token(md);
  // The classifier's products (N × C by C × V, V = 50,304 for GPT-2) run nearer the GPU's peak than the
  // blocks' on Gantry's CUDA backend: its FLOPs count at that ratio (engine_profile.h).
  const double logits_flops =
      fw.logits * (in.engine == EngineKind::kGantryCuda ? kGantryCudaClassifierFlopScale : 1);
  // Flash attention skips the masked half of the causal score matrix and recomputes QKᵀ in backward;
  // the materialised kernel multiplies the whole matrix.
  const double attn_fwd = l.flash_attention ? 0.5 * fw.layer_attn : fw.layer_attn;
  const double attn_bwd = l.flash_attention ? 0.5 * 2.5 * fw.layer_attn : 2.0 * fw.layer_attn;
  double recompute = 0;
  if (l.recompute == Recompute::kFull) recompute = fw.layer_gemm + attn_fwd;
  if (l.recompute == Recompute::kSelective && !l.flash_attention) recompute = fw.layer_attn;
  // The generic model's pipeline rank holds ceil(L / pp) blocks and the classifier besides (the last stage's
  // work, a stack that splits blocks evenly). Gantry's CUDA backend splits by cost instead, the classifier
  // counted on the last virtual stage (plan_cuda_pipeline_layers): its pipeline runs at the pace of the
  // rank whose chunks cost most, which at 350M on pp 2 is about half the model, not 14 blocks and the
  // classifier (+13 % against a measured step, docs/PERF.md call W1).
  double layers = r.layers_per_device, logits_share = 1;
  if (in.engine == EngineKind::kGantryCuda && l.pp > 1) {
    const std::vector<int> virtual_layers = plan_cuda_pipeline_layers(md, l.pp * l.vp);
    const double block = 3 * fw.layer_gemm + attn_fwd + attn_bwd;  // forward and backward
    const double classifier = 3 * logits_flops;
    double most = -1;
    for (int rank = 0; rank < l.pp; ++rank) {
      double blocks = 0, last = 0;
      for (int chunk = 0; chunk < l.vp; ++chunk) {
        const int v = chunk * l.pp + rank;
        blocks += virtual_layers[static_cast<size_t>(v)];
        if (v == l.pp * l.vp - 1) last = 1;
      }
      const double cost = blocks * block + last * classifier;
      if (cost > most) most = cost, layers = blocks, logits_share = last;
    }
  }
  // Memory-bound work (norms, activations, dropout, residual adds, a materialised softmax, the fp32
  // cross-entropy) moves bytes, not FLOPs: every activation Korthikanti et al. count is written in the
  // forward, read back in the backward and has its gradient written, about three passes over those bytes
  // (four with full recomputation, which writes them again); the logits take about four fp32 passes.
  ActivationShape all_kept{.micro_batch = l.micro_batch,
                           .tp = l.tp,
                           .cp = l.cp,
                           .sequence_parallel = l.sequence_parallel,
                           .recompute = Recompute::kNone,
                           .flash_attention = l.flash_attention};
  const double layer_traffic = plan_activation_layer_bytes(md, all_kept);
  // Gantry's CUDA classifier runs a chunk of rows at a time in bf16: the product writes the logits, the
  // loss kernel reads them and writes their gradient in place, the two gradient products read it, about
  // 10 bytes a logit (engine/core/cuda/backend_cuda.cu, classifier); others keep fp32 logits, about 16.
  const double logit_bytes = in.engine == EngineKind::kGantryCuda ? 10.0 : 16.0;
  const double logits_traffic = logit_bytes * tokens_mb * md.vocab / l.tp;
  const double bw = c.gpu.hbm_bw;
  const double gemm_s = tokens_mb / l.tp / peak;  // seconds per FLOP per token of one tp rank
  // One block's forward and backward of a micro-batch, and the classifier's (half its logit traffic each).
  // gantry-cuda: a micro-batch's fixed cost (engine_profile.h), spread over the model's blocks, so that a
  // pipeline stage pays its blocks' share, a third in the forward as the products.
  const double block_fixed = in.engine == EngineKind::kGantryCuda ? kGantryCudaMicroBatchCost / md.layers : 0;
  const double block_fwd = gemm_s * (fw.layer_gemm + attn_fwd) + layer_traffic / bw + block_fixed / 3;
  const double block_bwd = gemm_s * (2 * fw.layer_gemm + attn_bwd + recompute) + 2 * block_fixed / 3 +
                           layer_traffic * (l.recompute == Recompute::kFull ? 3 : 2) / bw;
  const double classifier_fwd = gemm_s * logits_flops + 0.5 * logits_traffic / bw;
  const double classifier_bwd = gemm_s * 2 * logits_flops + 0.5 * logits_traffic / bw;
  const double t_fwd = layers * block_fwd + logits_share * classifier_fwd;
  const double t_bwd = layers * block_bwd + logits_share * classifier_bwd;
  const double t_attn_fwd_layer = tokens_mb * attn_fwd / l.tp / peak;
  const double t_attn_bwd_layer = tokens_mb * attn_bwd / l.tp / peak;

  double exposed_mb = 0;                   // communication on the critical path of one micro-batch
  double pp_send_mb = 0, pp_transfer = 0;  // the pipeline's sends of one micro-batch; one of them
  // gantry-cuda at tp > 1: what a tp rank's compute loses to tensor parallelism, per layer of a micro-batch
  // (the collectives' kernels beside the products; tp's fixed cost of a micro-batch, spread over the blocks).
  double tp_drag_layer = 0;
  const double m_steps = r.m;

  // ---- Tensor parallel: Megatron's two all-reduces forward and two backward per layer (Narayanan et al.
  // 2021 §2.3), an all-gather and a reduce-scatter each with sequence parallelism (same bytes, Korthikanti
  // §4.2.2); full recomputation repeats the forward pair. Overlap (PlanTraining::tp_overlap): each forward
  // collective hides under the row-parallel GEMM that produces it (attention out, MLP down), each backward
  // one under the weight-gradient GEMM of the column-parallel layer whose input gradient it reduces (QKV,
  // MLP up), chunk by chunk; what the product cannot cover stays exposed.
  if (l.tp > 1) {
    CommAxis a;
    a.axis = "tp";
    a.group = l.tp;
    const GroupLink link = plan_group_link(c, l.tp, 1);
    a.crosses_nodes = link.crosses_nodes;
    a.bus_bw = link.bw;
    const int per_layer = 4 + (l.recompute == Recompute::kFull ? 2 : 0);
    const double bytes = kActivationBytes * tokens_mb * md.hidden;
    double one = plan_collective_seconds(Collective::kAllReduce, bytes, l.tp, link);
    if (l.sequence_parallel) {
      one = plan_collective_seconds(Collective::kAllGather, bytes, l.tp, link) +
            plan_collective_seconds(Collective::kReduceScatter, bytes, l.tp, link);
    }
    a.pattern = std::string(l.sequence_parallel ? "all-gather + reduce-scatter" : "all-reduce") + " x" +
                std::to_string(per_layer) + " per layer per micro-batch";
    if (tr.tp_overlap > 0) a.pattern += ", overlapped with the next chunk's GEMM";
    // The products beside the layer's collectives, per micro-batch (one tp rank's share).
    const double d = md.hidden, kv = static_cast<double>(plan_model_kv_dim(md)), f = plan_model_ffn(md);
    const double up = (md.ffn_kind == FfnKind::kGelu ? 1 : 2) * 2 * d * f;
    const double products[] = {2 * d * d * gemm_s, 2 * f * d * gemm_s,       // forward
                               2 * d * (d + 2 * kv) * gemm_s, up * gemm_s};  // backward
    double exposed_layer = 0;
    for (int k = 0; k < per_layer; ++k) {
      exposed_layer +=
          plan_tp_exposed_seconds(one, products[k % 2 + (k >= 2 && k < 4 ? 2 : 0)], tr.tp_overlap);
    }
    // Gantry's CUDA backend (docs/PERF.md calls T1-T10): the collectives' kernels beside the products, a
    // fixed cost a micro-batch, and the stream's waits, which NCCL's latency keeps from shrinking with the
    // micro-batch.
    if (in.engine == EngineKind::kGantryCuda) {
      tp_drag_layer = kGantryCudaTpCollectiveDrag * per_layer * one + kGantryCudaTpMicroBatchCost / md.layers;
      exposed_layer = kGantryCudaTpExposedFraction * per_layer * one + kGantryCudaTpLayerLatency;
    }
    const double calls = per_layer * layers * m_steps;
    if (tp_drag_layer > 0) {
      a.pattern += "; costs the products beside it " + plan_ms(m_steps * layers * tp_drag_layer) +
                   " a step (in compute)";
    }
    a.bytes = calls * bytes * (l.sequence_parallel ? 2 : 1);
    a.seconds = calls * one;
    a.exposed_s = layers * m_steps * exposed_layer;
    exposed_mb += layers * exposed_layer;
    p.comm.push_back(a);
  }

  // ---- Context parallel: ring attention passes K and V chunks round the cp ranks (cp − 1 steps) forward,
  // K, V and their gradients backward; hidden under the attention core when it is long enough.
  if (l.cp > 1) {
    CommAxis a;
    a.axis = "cp";
    a.group = l.cp;
    const GroupLink link = plan_group_link(c, l.cp, l.tp);
    a.crosses_nodes = link.crosses_nodes;
    a.bus_bw = link.bw;
    a.pattern = "send/recv of K,V chunks x" + std::to_string(l.cp - 1) + " per layer per micro-batch";
    const double kv_chunk =
        kActivationBytes * 2.0 * tokens_mb * static_cast<double>(plan_model_kv_dim(md)) / l.tp;
    const double step = plan_collective_seconds(Collective::kSendRecv, kv_chunk, l.cp, link);
    const double fwd = (l.cp - 1) * step, bwd = 2 * fwd;
    const double passes_fwd = l.recompute == Recompute::kFull ? 2 : 1;
    const double exposed_layer =
        passes_fwd * std::max(0.0, fwd - t_attn_fwd_layer) + std::max(0.0, bwd - t_attn_bwd_layer);
    a.bytes = layers * m_steps * (l.cp - 1) * kv_chunk * (passes_fwd + 2);
    a.seconds = layers * m_steps * (passes_fwd * fwd + bwd);
    a.exposed_s = layers * m_steps * exposed_layer;
    exposed_mb += layers * exposed_layer;
    p.comm.push_back(a);
  }

  // ---- Pipeline: each micro-batch sends its activation forward and its gradient back at every stage
  // boundary, once per model chunk; split over the tp ranks (Narayanan et al. 2021 §4.1 scatter/gather).
  if (l.pp > 1) {
    CommAxis a;
    a.axis = "pp";
    a.group = l.pp;
    const GroupLink link = plan_group_link(c, l.pp, l.tp * l.cp);
    a.crosses_nodes = link.crosses_nodes;
    a.bus_bw = link.bw;
    const double sends = 2.0 * l.vp;
    a.pattern = "send/recv x" + std::to_string(static_cast<int>(sends)) + " per micro-batch";
    const double bytes = kActivationBytes * tokens_mb * md.hidden / l.tp;
    const double one = plan_collective_seconds(Collective::kSendRecv, bytes, l.pp, link);
    a.bytes = sends * m_steps * bytes;
    a.seconds = sends * m_steps * one;
    a.exposed_s = a.seconds;
    pp_send_mb = sends * one;
    pp_transfer = one;
    p.comm.push_back(a);
  }

  // ---- Data parallel: gradient all-reduce (ZeRO 0), reduce-scatter + parameter all-gather (ZeRO 1, 2),
  // per-micro-batch gathers and reduce-scatters (ZeRO 3); HSDP adds an all-reduce of the shard across
  // replicas. Gradient traffic hides under the last micro-batch's backward except its last bucket, the
  // ZeRO 1/2 parameter gather under the next step's first forward.
  double exposed_step = 0;
  const double params_dev =
      static_cast<double>(std::max(params_on_stage(md, r, 0), params_on_stage(md, r, l.pp - 1)));
  if (l.dp > 1) {
    CommAxis a;
    a.axis = "dp";
    a.group = l.dp;
    const int stride = l.tp * l.cp * l.pp;
    const GroupLink dp_link = plan_group_link(c, l.dp, stride);
    const GroupLink shard_link = plan_group_link(c, r.shard, stride);
    const GroupLink replica_link = plan_group_link(c, r.replicas, stride * r.shard);
    a.crosses_nodes = dp_link.crosses_nodes;
    a.bus_bw = dp_link.bw;
    const double grads = params_dev * tr.grad_bytes, weights = params_dev * tr.weight_bytes;
    if (l.zero == 0) {
      a.pattern = "all-reduce of gradients per step";
      a.bytes = grads;
      a.seconds = plan_collective_seconds(Collective::kAllReduce, grads, l.dp, dp_link);
      const double last_bucket =
          plan_collective_seconds(Collective::kAllReduce, std::min(grads, tr.bucket_bytes), l.dp, dp_link);
      a.exposed_s = std::max(last_bucket, a.seconds - t_bwd);
      exposed_step += a.exposed_s;
    } else {
      const double replica_ar =
          plan_collective_seconds(Collective::kAllReduce, grads / r.shard, r.replicas, replica_link);
      const double rs = plan_collective_seconds(Collective::kReduceScatter, grads, r.shard, shard_link);
      const double ag = plan_collective_seconds(Collective::kAllGather, weights, r.shard, shard_link);
      const double last_bucket = plan_collective_seconds(
          Collective::kReduceScatter, std::min(grads, tr.bucket_bytes), r.shard, shard_link);
      if (l.zero <= 2) {
        a.pattern = "reduce-scatter of gradients + all-gather of weights per step";
        a.bytes = grads + weights;
        a.seconds = rs + ag;
        const double grad_exposed = std::max(last_bucket, rs + replica_ar - t_bwd);
        const double gather_exposed = std::max(0.0, ag - t_fwd);
        a.exposed_s = grad_exposed + gather_exposed;
        exposed_step += a.exposed_s;
      } else {
        a.pattern = "all-gather of weights x2 + reduce-scatter of gradients per micro-batch";
        a.bytes = m_steps * (2 * weights + grads);
        a.seconds = m_steps * (2 * ag + rs);
        const double per_mb = std::max(0.0, ag - t_fwd) + std::max(0.0, ag + rs - t_bwd);
        exposed_mb += per_mb;
        a.exposed_s = m_steps * per_mb;
      }
      if (r.replicas > 1) {
        a.pattern += " + all-reduce across " + std::to_string(r.replicas) + " replicas";
        a.bytes += grads / r.shard;
        a.seconds += replica_ar;
        if (l.zero == 3) {
          const double e = std::max(0.0, replica_ar - t_bwd);
          a.exposed_s += e;
          exposed_step += e;
        }
      }
    }
    p.comm.push_back(a);
  }
  for (CommAxis& a : p.comm) a.overlappable_s = std::max(0.0, a.seconds - a.exposed_s);

  // ---- AdamW over the local shard is memory-bound: read the gradient, read and write master, m and v,
  // write the bf16 weights (read and write them when they are the master copy).
  const double params_opt = params_dev / (l.zero >= 1 ? r.shard : 1);
  const double opt_bytes = tr.grad_bytes + 2.0 * tr.master_bytes + 2.0 * tr.optimizer_bytes +
                           tr.weight_bytes + (tr.master_bytes == 0 ? tr.weight_bytes : 0);
  p.optimizer_s = params_opt * opt_bytes /
                  (c.gpu.hbm_bw * (in.engine == EngineKind::kGantryCuda ? kGantryCudaOptimizerBandwidth : 1));

  // ---- The step: m micro-batches, the fill and drain of the pipeline, what communication is exposed.
  const double tp_drag_mb = layers * tp_drag_layer;
  // gantry-cuda: the dp collectives the backward hides still take its SMs while they run.
  double dp_drag = 0;
  for (CommAxis& a : p.comm) {
    if (in.engine != EngineKind::kGantryCuda || a.axis != "dp" || a.overlappable_s <= 0) continue;
    dp_drag = kGantryCudaCollectiveDrag * a.overlappable_s;
    a.pattern += "; the hidden part costs the backward " + plan_ms(dp_drag) + " a step (in compute)";
  }
  const double t_mb = t_fwd + t_bwd + tp_drag_mb + exposed_mb + pp_send_mb;
  p.bubble_fraction = plan_bubble_fraction(l.schedule, l.pp, l.vp, r.m);
  p.bubble_step_fraction = plan_bubble_step_fraction(l.schedule, l.pp, l.vp, r.m);
  // The fill and drain: (p − 1)/k micro-batch times (k: 1, v interleaved, 3 ZB-H1, whose deferred weight
  // passes fill the rest; the split moves the weight gradient's FLOPs, it adds none).
  const double v = plan_bubble_divisor(l.schedule, l.vp);
  p.compute_s = m_steps * (t_fwd + t_bwd + tp_drag_mb) + dp_drag;
  p.bubble_s = l.pp > 1 ? (l.pp - 1) / v * t_mb : 0;  // (no 0 × ∞ where gantry-cpu skips the GPU model)
  p.exposed_comm_s = m_steps * (exposed_mb + pp_send_mb) + exposed_step;
  p.step_s = p.compute_s + p.bubble_s + p.exposed_comm_s + p.optimizer_s;
  // Gantry's CUDA pipeline, priced as it runs: every rank's program (telemetry/pipeline_program.h) timed
  // with its own chunks' passes, where the formula assumes equal stages and ZB-H1's three equal passes. On
  // the GPU the last stage runs the classifier inside its backward, and an input pass is most of a backward
  // (the weight pass holds the blocks' weight-gradient products and, on the last stage, the classifier's):
  // ZB-H1 measured no faster than 1F1B while the classifier's weight product sat in the input pass, which
  // the formula put 7 % ahead (docs/PERF.md call P1).
  if (in.engine == EngineKind::kGantryCuda && l.pp > 1) {
    const double block_f = block_fwd + tp_drag_layer / 3, block_b = block_bwd + 2 * tp_drag_layer / 3;
    const double block_w = gemm_s * fw.layer_gemm;
    const double classifier = classifier_fwd + classifier_bwd;  // all of it in the last stage's backward
    // ZB-H1's last stage: the dwte product over the kept d(logits), which it reads once more (bf16).
    const double classifier_w = gemm_s * logits_flops + 2.0 * tokens_mb * md.vocab / l.tp / bw;
    // ZB-H1's input pass copies each block's d(res3) and d(res2) ((N, C) bf16, read and written) for its
    // weight pass (KeptGrads), where a whole backward reads them in place.
    const double block_keep =
        l.schedule == Schedule::kZeroBubbleH1 ? 2 * 2 * kActivationBytes * tokens_mb * md.hidden / bw : 0;
    // The other axes' exposed time of a micro-batch (tp, ZeRO 3) rides on its blocks, half each way.
    const double block_comm = layers > 0 ? exposed_mb / layers : 0;
    const std::vector<int> virtual_layers = plan_cuda_pipeline_layers(md, l.pp * l.vp);
    const size_t stages = virtual_layers.size();
    PipelineCosts costs;
    costs.transfer_s = pp_transfer;
    for (size_t k = 0; k < stages; ++k) {
      const double n = virtual_layers[k], head = k + 1 == stages ? classifier : 0;
      costs.forward.push_back(n * (block_f + block_comm / 2));
      costs.backward.push_back(n * (block_b + block_comm / 2) + head);
      costs.weight.push_back(n * block_w + (head > 0 ? classifier_w : 0));
      costs.input.push_back(costs.backward.back() - costs.weight.back() + n * block_keep);
    }
    const PipelineTiming t = pipeline_program_timing(plan_pipeline_schedule(cuda_pipe_schedule(l.schedule)),
                                                     l.pp, l.vp, r.m, costs);
    const size_t busiest =
        static_cast<size_t>(std::max_element(t.busy.begin(), t.busy.end()) - t.busy.begin());
    double blocks = 0;  // the busiest rank's
    for (size_t k = busiest; k < stages; k += static_cast<size_t>(l.pp)) blocks += virtual_layers[k];
    const double comm = m_steps * blocks * block_comm;  // inside its busy time
    p.compute_s = t.busy[busiest] - comm + dp_drag;
    p.bubble_s = std::max(0.0, t.makespan - t.busy[busiest] - m_steps * pp_send_mb);
    p.step_s = t.makespan + dp_drag + exposed_step + p.optimizer_s;
    p.exposed_comm_s = p.step_s - p.compute_s - p.bubble_s - p.optimizer_s;
  }
  if (in.engine == EngineKind::kGantryCpu) cpu_step_time(in, r, &p);
  const double tokens_step = static_cast<double>(r.global_batch) * md.seq;
  p.tokens_per_s = tokens_step / p.step_s;

  p.convention = tr.mfu_convention;
  p.peak_flops = c.gpu.bf16_flops;
  p.model_flops_per_token = plan_model_flops_per_token(md, tr.mfu_convention);
  p.hardware_flops_per_token = plan_hardware_flops_per_token(md, l.recompute, tr.mfu_convention);
  const Utilization u = plan_utilization(md, l.recompute, r.global_batch, p.step_s, c.gpus, c.gpu.bf16_flops,
                                         tr.mfu_convention);
  p.mfu = u.mfu;
  p.hfu = u.hfu;

  // ---- Training time, checkpoint, failures.
  p.tokens = tr.tokens > 0 ? tr.tokens : 20.0 * static_cast<double>(p.params);
  p.days_to_train = p.tokens / p.tokens_per_s / kSecondsPerDay;
  p.checkpoint_bytes = tr.checkpoint_bytes_per_param * static_cast<double>(p.params);
  const double write_bw = tr.checkpoint_write_bw > 0 ? tr.checkpoint_write_bw : 1e9 * p.nodes;
  p.checkpoint_write_s = p.checkpoint_bytes / write_bw;
  p.cluster_mtbf_s = c.node_mtbf_s > 0 ? c.node_mtbf_s / p.nodes : 0;
  p.young_interval_s = young_interval(p.checkpoint_write_s, p.cluster_mtbf_s);
  p.daly_interval_s = daly_interval(p.checkpoint_write_s, p.cluster_mtbf_s);
  p.goodput = p.cluster_mtbf_s > 0 ? checkpoint_goodput(p.daly_interval_s, p.checkpoint_write_s, tr.restart_s,
                                                        p.cluster_mtbf_s)
                                   : 1.0;
  p.days_to_train_expected = p.goodput > 0 ? p.days_to_train / p.goodput : 0;
  return p;
}

}  // namespace gantry
