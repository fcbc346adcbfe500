#include "engine/plan/engine_profile.h"

#include <algorithm>
#include <limits>
#include <string>

#include "telemetry/pipeline_program.h"  // pipeline_program: the order the backends run, replayed for slots

namespace gantry {

namespace {

constexpr uint64_t kF32 = 4, kBf16 = 2, kI32 = 4;

// Mirrors of the CUDA kernels' sizing constants (engine/core/cuda/kernels.cu, attention.cu). They size
// scratch buffers, so a change there changes the backend's memory; the GPU check in engine_profile_test
// catches a drift on any machine with a GPU.
constexpr uint64_t kNormPartials = 2048;            // kernels.cu: layernorm backward row groups
constexpr uint64_t kNormBlocks = 1024;              // kernels.cu: global norm partials
constexpr uint64_t kAdamwChunkElements = 1u << 16;  // kernels.cuh: adamw_chunk_elements()
constexpr uint64_t kAdamwChunkBytes = 32;       // sizeof(AdamWChunk): 3 uint64 offsets, uint32 count, decay
constexpr uint64_t kAttnKvQueryTile128 = 32;    // attention.cu kKvQueryTile<128>
constexpr uint64_t kAttnKvQueryTileSmall = 64;  // kKvQueryTile<64> (GANTRY_ATTN_BWD_KV_QTILE's default)
constexpr uint64_t kClassifierChunkBytes = 256u << 20;  // backend_cuda.cu classifier_region: least chunk

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

// kernels.cu bias_groups: row groups of the bias backward, sized to the width.
uint64_t bias_groups(uint64_t n, uint64_t oc) {
  const uint64_t g = std::clamp<uint64_t>(65536 / (oc / 8), 64, 2048);
  return std::min(n, g);
}

// attention.cu fast_scratch(B, T, NH, D).total: D = rowsum(dout ∘ out) per (b, h, t), padded to 64, then
// the fast backward's fp32 dQ accumulator, query tiles rounded up.
uint64_t attention_fast_scratch(uint64_t b, uint64_t t, uint64_t nh, uint64_t d) {
  const uint64_t bq = d == 128 ? kAttnKvQueryTile128 : kAttnKvQueryTileSmall;
  const uint64_t heads = b * nh;
  const uint64_t n_q = ceil_div(t, bq);
  const uint64_t acc = ceil_div(heads * t, 64) * 64;
  return acc + heads * n_q * bq * d;
}

struct Table {
  std::vector<EngineAllocation> rows;
  double in_flight = 1;  // EngineMemory::in_flight
  void add(std::string name, std::string shape, MemoryBucket b, uint64_t bytes_each, uint64_t count = 1,
           bool in_backend = true) {
    rows.push_back({std::move(name), std::move(shape), b, count, bytes_each, in_backend});
  }
};

// Element counts of one tp rank's tensors on a pipeline stage of `layers` blocks, in gpt_param_table's
// order (tensor_parallel.cpp split_of: wte's rows, QKV's and MLP-up's rows with their biases, the output
// projections' columns; the rest whole). The AdamW chunk table is built tensor by tensor.
std::vector<uint64_t> rank_tensors(const PlanModel& m, uint64_t tp, int layers, bool first, bool last) {
  const uint64_t c = m.hidden, v = m.vocab, t = m.seq;
  std::vector<uint64_t> n;
  if (first) n = {v / tp * c, t * c};
  for (int l = 0; l < layers; ++l) {
    for (uint64_t k : {c, c, 3 * c * c / tp, 3 * c / tp, c * c / tp, c, c, c, 4 * c * c / tp, 4 * c / tp,
                       4 * c * c / tp, c})
      n.push_back(k);
  }
  if (last) n.insert(n.end(), {c, c});
  return n;
}

// engine/core/parallel/shard_plan.cpp mirrored for one dp rank: units (the tensors before the blocks, each
// block, the tensors after), buckets formed from the top unit down up to `cap` floats (every unit its own at
// ZeRO 3, the first unit always alone), each bucket's owned block comm_block(count, dp, rank); what
// ZeroDeviceState sizes from them.
struct ShardSizes {
  uint64_t shard = 0;           // S: owned elements (P at ZeRO 0)
  uint64_t chunks = 0;          // AdamW chunks: per tensor at ZeRO 0, per owned segment otherwise
  uint64_t first_bucket = 0;    // the first unit's bucket (the embeddings' on stage 0)
  uint64_t largest_bucket = 0;  // the largest other bucket
  uint64_t first_unit = 0, last_unit = 0;
  // ZeroDeviceState's blocks: the units between the embeddings and the final norm where the stage has
  // them; a stage without either keeps its end units as blocks (gathered per use under ZeRO 3).
  uint64_t largest_block = 0;
  uint64_t largest_other_bucket = 0;  // the largest bucket but the embeddings' (every bucket without them)
  // Sequence parallel (`flagged` given): the owned elements of the flagged tensors and the runs they make
  // in the rank's gradient buffer (ShardPlan::gradient_runs: global offsets at ZeRO 0-1, shard offsets at
  // 2-3, neighbours merged).
  uint64_t flagged = 0, flagged_runs = 0;
};
// `starts`: units that begin a bucket of their own (shard_plan_make's bucket_starts: an interleaved GPU
// rank's chunks 1 to vp − 1, pipeline_chunk_bucket_starts).
ShardSizes shard_sizes(const std::vector<uint64_t>& tensors, const std::vector<int>& unit_of, uint64_t dp,
                       uint64_t rank, int zero, uint64_t cap, bool has_embeddings, bool has_final,
                       const std::vector<int>& starts = {}, const std::vector<bool>& flagged = {}) {
  ShardSizes z;
  std::vector<uint64_t> units, tensor_at;
  uint64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (static_cast<size_t>(unit_of[i]) == units.size()) units.push_back(0);
    units.back() += tensors[i];
    tensor_at.push_back(at);
    at += tensors[i];
  }
  const int n = static_cast<int>(units.size());
  std::vector<char> begins(units.size() + 1, 0);
  for (int u : starts) begins[static_cast<size_t>(u)] = 1;
  std::vector<std::vector<int>> groups;
  for (int u = n - 1; u >= 1; --u) {
    uint64_t sum = 0;
    if (!groups.empty())
      for (int v : groups.back()) sum += units[static_cast<size_t>(v)];
    // Unit u + 1 (the group's lowest so far) beginning a bucket closes the group.
    if (groups.empty() || zero >= 3 || begins[static_cast<size_t>(u) + 1] ||
        sum + units[static_cast<size_t>(u)] > cap)
      groups.emplace_back();
    groups.back().push_back(u);
  }
  groups.push_back({0});
  std::reverse(groups.begin(), groups.end());
  std::vector<uint64_t> unit_at(units.size() + 1, 0);
  for (size_t u = 0; u < units.size(); ++u) unit_at[u + 1] = unit_at[u] + units[u];
  uint64_t run_end = ~uint64_t{0};  // where the last flagged run ends in the gradient buffer
  for (size_t g = 0; g < groups.size(); ++g) {
    const int lo = *std::min_element(groups[g].begin(), groups[g].end());
    const int hi = *std::max_element(groups[g].begin(), groups[g].end());
    const uint64_t offset = unit_at[static_cast<size_t>(lo)],
                   count = unit_at[static_cast<size_t>(hi) + 1] - offset;
    if (g == 0) {
      z.first_bucket = count;
    } else {
      z.largest_bucket = std::max(z.largest_bucket, count);
    }
    // comm_block (communicator.h): the low ranks take the remainder's extra element.
    const uint64_t base = count / dp, extra = count % dp;
    const uint64_t own_at = offset + (zero >= 1 ? rank * base + std::min(rank, extra) : 0);
    const uint64_t own = zero >= 1 ? base + (rank < extra ? 1 : 0) : count;
    for (size_t i = 0; i < flagged.size() && i < tensors.size(); ++i) {
      const uint64_t from = std::max(own_at, tensor_at[i]),
                     to = std::min(own_at + own, tensor_at[i] + tensors[i]);
      if (!flagged[i] || from >= to) continue;
      const uint64_t run_at = zero >= 2 ? z.shard + (from - own_at) : from;
      if (run_at != run_end) ++z.flagged_runs;
      run_end = run_at + (to - from);
      z.flagged += to - from;
    }
    z.shard += own;
    for (size_t i = 0; zero >= 1 && i < tensors.size(); ++i) {  // the owned block cut at tensor boundaries
      const uint64_t from = std::max(own_at, tensor_at[i]),
                     to = std::min(own_at + own, tensor_at[i] + tensors[i]);
      if (from < to) z.chunks += ceil_div(to - from, kAdamwChunkElements);
    }
  }
  if (zero == 0)
    for (uint64_t k : tensors) z.chunks += ceil_div(k, kAdamwChunkElements);
  z.first_unit = units.front();
  z.last_unit = units.back();
  const int first_block = has_embeddings ? 1 : 0, last_block = n - 1 - (has_final ? 1 : 0);
  for (int u = first_block; u <= last_block; ++u)
    z.largest_block = std::max(z.largest_block, units[static_cast<size_t>(u)]);
  z.largest_other_bucket = has_embeddings ? z.largest_bucket : std::max(z.largest_bucket, z.first_bucket);
  return z;
}

// engine/core/cpu/backend_cpu.cpp: the four state vectors, acts_ (one flat allocation carved in
// allocate_activations()'s order) and the backward scratch vectors; memory_bytes() sums them all.
// The parameters of one tensor-parallel rank are rank_tensors' (tensor_parallel.cpp's split_of): wte's
// vocabulary rows, the QKV's and MLP-up's rows with their biases, the output projections' columns;
// positions, LayerNorms and the row-parallel layers' biases whole. tp 1: plan_param_counts(m).total.

// The units of a stage's tensors as engine/core/parallel/shard_plan.cpp units_of finds them: the tensors
// before the blocks (the embeddings, stage 0), each block's 12, the tensors after them (the final norm, the
// last stage).
std::vector<int> unit_of_tensors(size_t tensors, int layers, bool first) {
  std::vector<int> unit_of;
  const size_t blocks_from = first ? 2 : 0, blocks_to = blocks_from + 12 * static_cast<size_t>(layers);
  const int emb = first ? 1 : 0;
  for (size_t i = 0; i < tensors; ++i) {
    unit_of.push_back(i < blocks_from ? 0
                      : i < blocks_to ? emb + static_cast<int>((i - blocks_from) / 12)
                                      : emb + layers);
  }
  return unit_of;
}

// engine/core/parallel/zero_host_state.cpp, one dp rank of a CPU stage (the whole model at pp 1, a tp rank's
// share at tp > 1): ZeroHostState's allocation (allocated(), shard_memory's formula) on the shard plan
// shard_plan_make cuts from the rank's table. P = the table's elements, S = this dp rank's owned share,
// E and F the first and last units (the embeddings and the final norm where the stage has them; on a stage
// without them its end blocks, as ShardPlan::embedding_unit() and final_unit() are unit 0 and the last), U
// the largest unit between them, B the largest bucket but unit 0's:
//   params P (ZeRO 0-2), S + E + F + 2U (ZeRO 3: the shard, the end units gathered for the step, two block
//   slots); grads P (0-1), S + E's bucket + 2B (2-3: the shard, the staging); AdamW m and v S each (P at 0).
// The CPU honours the ZeRO stage at dp 1 too (the state is then the whole table, the slots and staging
// still allocated). `pipeline`: the stage keeps whole buffers for the step (backend_cpu_pipeline.cpp):
// ZeRO 2-3 the gradients (work_grads_), ZeRO 3 the parameters (work_params_).
void cpu_state_rows(Table* tb, const PlanModel& m, uint64_t tp, int layers, bool first, bool last,
                    bool pipeline, const CudaDataParallelPlan& dpp) {
  const std::vector<uint64_t> tensors = rank_tensors(m, tp, layers, first, last);
  const int zero = dpp.zero;
  const ShardSizes z = shard_sizes(tensors, unit_of_tensors(tensors.size(), layers, first),
                                   static_cast<uint64_t>(dpp.dp), static_cast<uint64_t>(dpp.rank), zero,
                                   std::max<uint64_t>(1, dpp.bucket_bytes / kF32), true, true);
  uint64_t p = 0;
  for (uint64_t k : tensors) p += k;
  using MB = MemoryBucket;
  tb->add("params", zero < 3 ? "(P) fp32" : "(S) fp32", MB::kWeights, (zero < 3 ? p : z.shard) * kF32);
  tb->add("grads", zero < 2 ? "(P) fp32" : "(S) fp32", MB::kGradients, (zero < 2 ? p : z.shard) * kF32);
  tb->add("adam_m", zero == 0 ? "(P) fp32" : "(S) fp32", MB::kOptimizer, z.shard * kF32);
  tb->add("adam_v", zero == 0 ? "(P) fp32" : "(S) fp32", MB::kOptimizer, z.shard * kF32);
  if (zero >= 3) {
    tb->add("param_slots", "(first unit) + (last unit) + 2 x (largest unit between) fp32", MB::kWeights,
            (z.first_unit + z.last_unit + 2 * z.largest_block) * kF32);
  }
  if (zero >= 2) {
    tb->add("grad_staging", "(first unit's bucket) + 2 x (largest other bucket) fp32", MB::kGradients,
            (z.first_bucket + 2 * z.largest_bucket) * kF32);
  }
  if (pipeline && zero >= 3) tb->add("work_params", "(P) fp32", MB::kWeights, p * kF32);
  if (pipeline && zero >= 2) tb->add("work_grads", "(P) fp32", MB::kGradients, p * kF32);
}

// At tp > 1 the sharded widths are the rank's: C/tp of the attention, NH/tp heads, 4C/tp of the MLP, V/tp
// of the logits (backend_cpu.cpp's Cl, NHl, Hl and V). Over dp, `dpp`'s rank of its ZeRO stage.
Table cpu_table(const PlanModel& m, uint64_t b, uint64_t tp, const CudaDataParallelPlan& dpp = {}) {
  const uint64_t t = m.seq, c = m.hidden, nh = m.heads / tp, v = m.vocab / tp, n = b * t, l = m.layers;
  const uint64_t cl = c / tp, h = 4 * c / tp;
  using MB = MemoryBucket;
  Table tb;
  cpu_state_rows(&tb, m, tp, m.layers, true, true, false, dpp);
  tb.add("encoded", "(N, C) fp32", MB::kActivations, n * c * kF32);
  tb.add("layer.ln1", "(N, C) fp32", MB::kActivations, n * c * kF32, l);
  tb.add("layer.ln1_mean", "(N) fp32", MB::kActivations, n * kF32, l);
  tb.add("layer.ln1_rstd", "(N) fp32", MB::kActivations, n * kF32, l);
  tb.add("layer.qkv", "(N, 3C) fp32", MB::kActivations, n * 3 * cl * kF32, l);
  tb.add("layer.att", "(B, NH, T, T) fp32", MB::kActivations, b * nh * t * t * kF32, l);
  tb.add("layer.atty", "(N, C) fp32", MB::kActivations, n * cl * kF32, l);
  tb.add("layer.res2", "(N, C) fp32", MB::kActivations, n * c * kF32, l);
  tb.add("layer.ln2", "(N, C) fp32", MB::kActivations, n * c * kF32, l);
  tb.add("layer.ln2_mean", "(N) fp32", MB::kActivations, n * kF32, l);
  tb.add("layer.ln2_rstd", "(N) fp32", MB::kActivations, n * kF32, l);
  tb.add("layer.fch", "(N, 4C) fp32", MB::kActivations, n * h * kF32, l);
  tb.add("layer.fch_gelu", "(N, 4C) fp32", MB::kActivations, n * h * kF32, l);
  tb.add("layer.res3", "(N, C) fp32", MB::kActivations, n * c * kF32, l);
  tb.add("lnf", "(N, C) fp32", MB::kActivations, n * c * kF32);
  tb.add("lnf_mean", "(N) fp32", MB::kActivations, n * kF32);
  tb.add("lnf_rstd", "(N) fp32", MB::kActivations, n * kF32);
  tb.add("probs", "(N, V) fp32", MB::kActivations, n * v * kF32);  // logits, then softmax in place
  tb.add("losses", "(N) fp32", MB::kActivations, n * kF32);
  tb.add("dres", "(N, C) fp32", MB::kBuffers, n * c * kF32);
  tb.add("dln", "(N, C) fp32", MB::kBuffers, n * c * kF32);
  tb.add("datty", "(N, C) fp32", MB::kBuffers, n * cl * kF32);
  tb.add("dqkv", "(N, 3C) fp32", MB::kBuffers, n * 3 * cl * kF32);
  tb.add("dfch", "(N, 4C) fp32", MB::kBuffers, n * h * kF32);
  tb.add("dfch_gelu", "(N, 4C) fp32", MB::kBuffers, n * h * kF32);
  tb.add("dlogits", "(N, V) fp32", MB::kBuffers, n * v * kF32);
  return tb;
}

// A pipeline rank's model chunks (one at vp 1; chunk c is virtual stage c·pp + stage under interleaving):
// each one's blocks and the slots it holds, a micro-batch's activations each. The backends keep a pool of
// slots per chunk: one is taken at an activation's receive (or the forward, on the model's first chunk) and
// freed at its gradient's send (or the backward, on the first chunk; ZB-H1: the weight pass), a new one
// allocated only when all are busy (plan_pipeline_chunk_slots).
struct RankChunks {
  std::vector<int> layers;
  std::vector<int> slots;
  uint64_t total_layers() const {
    uint64_t l = 0;
    for (int k : layers) l += static_cast<uint64_t>(k);
    return l;
  }
  // Micro-batches of the rank's activations held at once: the chunks' slots weighted by their blocks
  // (the slot count itself at vp 1; every chunk has a block, rank_chunks).
  double in_flight() const {
    double held = 0;
    for (size_t c = 0; c < layers.size(); ++c) held += static_cast<double>(slots[c]) * layers[c];
    return held / static_cast<double>(total_layers());
  }
};

// engine/core/cpu/backend_cpu_pipeline.cpp, one pipeline rank of one dp rank: its parameters' state
// (cpu_state_rows over all its chunks' blocks, with the step's whole buffers under ZeRO 2-3), the last
// rank's copy of wte, the backward scratch (once per rank), each chunk's activation slots (a micro-batch's
// input, its output gradient, the chunk's blocks and on the model's last chunk the head; allocated as the
// schedule first holds that many at once), the last rank's ties (each micro-batch's final-norm output and
// logits gradient, kept for the first rank) and the first rank's d(embedding) per micro-batch and the one
// tie it receives at a time. Slots at vp 1 (plan_cpu_pipeline_slots): GPipe holds every micro-batch; 1F1B
// stage s holds min(m, p − s), one more on the stages that receive (s > 0: the next activation arrives into
// a slot of its own before the last backward frees one); ZB-H1 min(m, p) on every stage (a slot is freed at
// its weight pass), each with the blocks' kept output gradients. Interleaved, each chunk's count is the
// replayed program's (plan_pipeline_chunk_slots). As the backend's runs show (tests/app/plan_cli_test.cpp
// compares with real ranks).
Table cpu_pipeline_table(const PlanModel& m, uint64_t b, uint64_t tp, int pp, int stage, const RankChunks& rc,
                         uint64_t micro_batches, CudaPipeSchedule schedule, const CudaDataParallelPlan& dpp) {
  const bool first = stage == 0, last = stage == pp - 1;
  const bool zbh1 = schedule == CudaPipeSchedule::kZeroBubbleH1;
  const uint64_t t = m.seq, c = m.hidden, nh = m.heads / tp, v = m.vocab / tp, n = b * t;
  const uint64_t cl = c / tp, h = 4 * c / tp;
  using MB = MemoryBucket;
  Table tb;
  cpu_state_rows(&tb, m, tp, static_cast<int>(rc.total_layers()), first, last, true, dpp);
  if (last) tb.add("wte_copy", "(V, C) fp32", MB::kWeights, v * c * kF32);
  tb.add("dln", "(N, C) fp32", MB::kBuffers, n * c * kF32);
  tb.add("datty", "(N, C) fp32", MB::kBuffers, n * cl * kF32);
  tb.add("dqkv", "(N, 3C) fp32", MB::kBuffers, n * 3 * cl * kF32);
  tb.add("dfch", "(N, 4C) fp32", MB::kBuffers, n * h * kF32);
  tb.add("dfch_gelu", "(N, 4C) fp32", MB::kBuffers, n * h * kF32);
  // Under ZB-H1 each block also keeps its four matmuls' output gradients for the weight pass (BlockActs
  // d_fcproj, d_proj (N, C), d_fc (N, 4Cl), d_qkv (N, 3Cl)).
  const uint64_t block = n * c * 4 + n * cl + n * 4 + n * 3 * cl + b * nh * t * t + n * h * 2 +
                         (zbh1 ? 2 * n * c + n * h + n * 3 * cl : 0);
  const size_t chunks = rc.layers.size();
  for (size_t k = 0; k < chunks; ++k) {
    const bool head = last && k + 1 == chunks;  // the model's last chunk
    const uint64_t bytes =
        (2 * n * c + block * static_cast<uint64_t>(rc.layers[k]) + (head ? n * c + 2 * n + n * v + n : 0)) *
        kF32;
    const std::string parts =
        std::string(" (in, dout, blocks") + (zbh1 ? ", kept grads" : "") + (head ? ", head)" : ")");
    tb.add((chunks > 1 ? "slot of chunk " + std::to_string(k) : std::string("slot")) + parts,
           "one micro-batch's", MB::kActivations, bytes, static_cast<uint64_t>(rc.slots[k]));
  }
  tb.in_flight = rc.in_flight();
  if (last)
    tb.add("tie", "(N, C + V) fp32 per micro-batch", MB::kBuffers, (n * c + n * v) * kF32, micro_batches);
  if (first) {
    tb.add("dres0", "(N, C) fp32 per micro-batch", MB::kBuffers, n * c * kF32, micro_batches);
    // The tie data received from the last stage, one micro-batch's at a time (tie_buffer).
    tb.add("tie_in", "(N, C + V) fp32", MB::kBuffers, (n * c + n * v) * kF32);
  }
  return tb;
}

// engine/core/cuda/backend_cuda.cu, one rank: allocate(), acquire() and pipeline_step() through device<T>()
// (which memory_bytes() sums), ZeroDeviceState's constructor and build_chunks() (ZeRO 0), and the cuBLASLt
// workspace the Matmul object allocates for itself. tp 1, pp 1: the one-GPU backend. At tp > 1 the blocks'
// activations are this rank's share (Cl = C/tp, NHl = NH/tp, Hl = 4C/tp), wte its V/tp rows, and the
// vocab-parallel cross-entropy has its per-row buffers. At pp > 1 (`stage` of `pp`, `layers` blocks) the
// activations live in StageSlots, one per micro-batch in flight (acquire(), allocated as the first step's
// schedule first holds that many; plan_cuda_pipeline_slots), the step's tokens in one buffer of every
// micro-batch (pipeline_step, first step), the last stage keeps its wte copy (bf16) and that copy's fp32
// gradient, stage 0 the gradient received.
Table cuda_table(const PlanModel& m, uint64_t b, uint64_t tp, int pp, int stage, const RankChunks& rc,
                 uint64_t micro_batches, CudaPipeSchedule schedule, const CudaDataParallelPlan& dpp = {},
                 bool sequence_parallel = false) {
  const bool pipeline = pp > 1, first = stage == 0, last = stage == pp - 1;
  const int layers = static_cast<int>(rc.total_layers());
  const std::vector<uint64_t> tensors = rank_tensors(m, tp, layers, first, last);
  // Units: the embeddings (stage 0), each block (12 tensors), the final norm (the last stage). Interleaved,
  // each chunk's first block begins a bucket (pipeline_chunk_bucket_starts).
  std::vector<int> starts;
  for (size_t k = 0, unit = first ? 1 : 0; k + 1 < rc.layers.size(); ++k) {
    unit += static_cast<size_t>(rc.layers[k]);
    starts.push_back(static_cast<int>(unit));
  }
  // One GPU (dp 1) shards nothing: ZeRO 0 whatever was asked (the backend's constructor).
  const int zero = dpp.dp > 1 ? dpp.zero : 0;
  // Sequence parallel (tp > 1, pp 1): the tensors whose gradients each tp rank holds a part of, summed over
  // tp once a step: the LayerNorms and the row-parallel biases (every whole tensor but wpe).
  const bool sp = sequence_parallel && tp > 1 && !pipeline;
  std::vector<bool> flagged;
  if (sp) {
    flagged = {false, false};
    for (int k = 0; k < layers; ++k)
      flagged.insert(flagged.end(),
                     {true, true, false, false, false, true, true, true, false, false, false, true});
    flagged.insert(flagged.end(), {true, true});
  }
  const ShardSizes z =
      shard_sizes(tensors, unit_of_tensors(tensors.size(), layers, first), static_cast<uint64_t>(dpp.dp),
                  static_cast<uint64_t>(dpp.rank), zero, std::max<uint64_t>(1, dpp.bucket_bytes / kF32),
                  first, last, starts, flagged);
  uint64_t p = 0;
  for (uint64_t k : tensors) p += k;
  const uint64_t chunks = z.chunks, held = zero == 0 ? p : z.shard;
  const uint64_t t = m.seq, c = m.hidden, n = b * t, l = static_cast<uint64_t>(layers);
  const uint64_t nh = m.heads / tp, cl = c / tp, h = 4 * c / tp, vl = m.vocab / tp;
  using MB = MemoryBucket;
  Table tb;
  // ZeroDeviceState: at ZeRO 1 the master weights and moments are the rank's shard S, at 2 the gradients
  // too (with staging), at 3 the bf16 parameters too (with the units gathered for use). The embeddings'
  // slots only on the stage that has them (stage 0), the final norm's on the last; every other unit is a
  // block (a pipeline stage's end units too).
  tb.add("master", zero == 0 ? "(P) fp32" : "(S) fp32", MB::kOptimizer, held * kF32);
  tb.add("params_bf16", zero < 3 ? "(P) bf16" : "(S) bf16", MB::kWeights, (zero < 3 ? p : z.shard) * kBf16);
  tb.add("grads", zero < 2 ? "(P) fp32" : "(S) fp32", MB::kGradients, (zero < 2 ? p : z.shard) * kF32);
  tb.add("adam_m", zero == 0 ? "(P) fp32" : "(S) fp32", MB::kOptimizer, held * kF32);
  tb.add("adam_v", zero == 0 ? "(P) fp32" : "(S) fp32", MB::kOptimizer, held * kF32);
  if (zero >= 2) {
    tb.add("grad_slots",
           first ? "(embeddings' bucket) + 2 x (largest other bucket) fp32" : "2 x (largest bucket) fp32",
           MB::kGradients,
           ((first ? std::max<uint64_t>(z.first_bucket, 1) : 0) +
            2 * std::max<uint64_t>(z.largest_other_bucket, 1)) *
               kF32);
  }
  if (zero == 3) {
    tb.add("param_slots",
           first && last ? "(embeddings) + (final norm) + 2 x (largest block) bf16"
           : first       ? "(embeddings) + 2 x (largest block) bf16"
           : last        ? "(final norm) + 2 x (largest block) bf16"
                         : "2 x (largest block) bf16",
           MB::kWeights,
           ((first ? std::max<uint64_t>(z.first_unit, 1) : 0) +
            (last ? std::max<uint64_t>(z.last_unit, 1) : 0) + 2 * std::max<uint64_t>(z.largest_block, 1)) *
               kBf16);
  }
  // ZeroDeviceState's stats_ (loss sum, sum of squares, ...), norm_, and the backend's eval_sum_.
  tb.add("stats, norm, eval_sum", "(3), (1), (1) fp32", MB::kBuffers, kF32, 5);
  tb.add("hash_sum", "(1) uint64", MB::kBuffers, 8);
  tb.add("adamw_chunks", "(one per 64K elements a tensor) 32 B", MB::kBuffers, chunks * kAdamwChunkBytes);
  // The norm's per-chunk squares, summed apart over tp (split tensors) and pp (build_chunks).
  if (zero > 0 || tp > 1 || pipeline) tb.add("chunk_scratch", "(chunks) fp32", MB::kBuffers, chunks * kF32);
  // Sequence parallel: those gradients packed for their one all-reduce, and the two lists of runs
  // (CopyRun, 24 B each) that pack and unpack them.
  if (sp && z.flagged_runs > 0) {
    tb.add("sp_packed", "(owned LayerNorm and row-parallel bias elements) fp32", MB::kBuffers,
           z.flagged * kF32);
    tb.add("sp_runs", "2 x (runs) x 24 B", MB::kBuffers, 2 * z.flagged_runs * 24);
  }
  // One block's activations (layer_acts()), this tp rank's share; sequence parallel, the residual stream's
  // rows too (N/tp).
  const uint64_t nr = sp ? n / tp : n;
  struct Row {
    const char* name;
    const char* shape;
    uint64_t bytes;
  };
  const Row block[] = {{"layer.ln1", "(N, C) bf16", n * c * kBf16},
                       {"layer.ln1_mean", "(N) fp32", n * kF32},
                       {"layer.ln1_rstd", "(N) fp32", n * kF32},
                       {"layer.qkv", "(N, 3Cl) bf16", n * 3 * cl * kBf16},
                       {"layer.atty", "(N, Cl) bf16", n * cl * kBf16},
                       {"layer.lse", "(B, NHl, T) fp32", b * nh * t * kF32},
                       {"layer.res2", sp ? "(N/tp, C) bf16" : "(N, C) bf16", nr * c * kBf16},
                       {"layer.ln2", "(N, C) bf16", n * c * kBf16},
                       {"layer.ln2_mean", "(N) fp32", n * kF32},
                       {"layer.ln2_rstd", "(N) fp32", n * kF32},
                       {"layer.fch_pre", "(N, Hl) bf16", n * h * kBf16},
                       {"layer.fch_gelu", "(N, Hl) bf16", n * h * kBf16},
                       {"layer.res3", sp ? "(N/tp, C) bf16" : "(N, C) bf16", nr * c * kBf16}};
  if (!pipeline) {
    tb.add("encoded", "(N, C) bf16", MB::kActivations, n * c * kBf16);
    for (const Row& r : block) tb.add(r.name, r.shape, MB::kActivations, r.bytes, l);
  } else {
    if (last) {
      tb.add("wte_copy", "(V/tp, C) bf16", MB::kWeights, vl * c * kBf16);
      tb.add("dwte", "(V/tp, C) fp32", MB::kGradients, vl * c * kF32);
    }
    if (first) tb.add("dwte_in", "(V/tp, C) fp32", MB::kGradients, vl * c * kF32);
  }
  tb.add("lnf", "(N, C) bf16", MB::kActivations, n * c * kBf16);
  tb.add("lnf_mean", "(N) fp32", MB::kActivations, n * kF32);
  tb.add("lnf_rstd", "(N) fp32", MB::kActivations, n * kF32);
  tb.add("losses", "(N) fp32", MB::kActivations, n * kF32);
  tb.add("dln", "(N, C) bf16", MB::kBuffers, n * c * kBf16);
  // One allocation holds the classifier's logits chunk and, after it, the backward's dres, dfch, dqkv,
  // datty and tmp_nc (each padded to 128 elements, whole widths at any tp): as large as those buffers, at
  // least ~256 MB of rows (this tp rank's V/tp columns). A stage before the last runs no classifier.
  auto pad = [](uint64_t e) { return ceil_div(e, 128) * 128; };
  const uint64_t buffers = pad(n * c) * 3 + pad(n * 4 * c) + pad(n * 3 * c);
  const uint64_t cols = last ? vl : 1;
  const uint64_t rows = std::clamp<uint64_t>(kClassifierChunkBytes / (cols * kBf16), 1, n);
  const uint64_t region = std::max(buffers, rows * cols);
  tb.add("logits_and_backward_buffers",
         last ? "max(dres, dfch, dqkv, datty, tmp_nc; (min(N, 256 MiB / 2Vl), Vl)) bf16"
              : "dres, dfch, dqkv, datty, tmp_nc bf16",
         MB::kBuffers, region * kBf16);
  if (tp > 1) {
    // The vocab-parallel cross-entropy's row maxima and partial sums, this rank's and every rank's, for the
    // chunk's rows (sized from the region and V/tp on every stage).
    const uint64_t chunk_rows = std::min(region / vl, n);
    tb.add("ce_max, ce_all_max, ce_part, ce_all_part", "(R), (tp R), (2R), (2 tp R) fp32", MB::kBuffers,
           (3 + 3 * tp) * chunk_rows * kF32);
  }
  tb.add("scratch", "(max of the kernels' scratch) fp32", MB::kBuffers,
         plan_cuda_scratch_floats(m, static_cast<int>(b)).total() * kF32);
  tb.add("inputs, targets, bucket_token, positions", "(N) int32 each", MB::kBuffers, n * kI32, 4);
  tb.add("bucket_start", "(N + 1) int32", MB::kBuffers, (n + 1) * kI32);
  if (pipeline) {
    tb.add("tokens", "(5N + 1) int32 per micro-batch", MB::kBuffers, (5 * n + 1) * kI32, micro_batches);
    // Each chunk's StageSlots (acquire()): its blocks' activations, on the model's last chunk the final
    // norm's output.
    const bool zbh1 = schedule == CudaPipeSchedule::kZeroBubbleH1, early = zbh1 && zero >= 2;
    const size_t n_chunks = rc.layers.size();
    for (size_t k = 0; k < n_chunks; ++k) {
      const bool head = last && k + 1 == n_chunks;
      const uint64_t lk = static_cast<uint64_t>(rc.layers[k]);
      uint64_t slot = 2 * n * c * kBf16;
      for (const Row& r : block) slot += lk * r.bytes;
      if (head) slot += n * c * kBf16 + 2 * n * kF32;
      // ZB-H1: each block's KeptGrads, the output gradients its weight pass reads: d(res3), d(res2) (N, C),
      // d(fch) (N, Hl), d(qkv) (N, 3Cl), bf16.
      if (zbh1) slot += lk * (2 * n * c + n * h + n * 3 * cl) * kBf16;
      // ZB-H1 at ZeRO 2-3 (dp > 1): StageSlot::early, the input pass's parameter gradients, fp32: each
      // block's six C-wide ones (the LayerNorms', the projection biases'; whole C at any tp), the last
      // stage's final norm's two (early_floats).
      if (early) slot += (6 * lk + (head ? 2 : 0)) * c * kF32;
      // ZB-H1 on the last stage: StageSlot::dlogits, the (N, V/tp) d(logits) its input pass keeps for the
      // weight pass's dwte product, bf16.
      if (zbh1 && head) slot += n * vl * kBf16;
      const std::string kept = std::string(zbh1 ? ", kept grads" : "") + (early ? ", early" : "");
      tb.add((n_chunks > 1 ? "slot of chunk " + std::to_string(k) : std::string("slot")) +
                 " (in, dout, blocks" + kept + (head ? (zbh1 ? ", lnf, dlogits)" : ", lnf)") : ")"),
             "one micro-batch in flight's", MB::kActivations, slot, static_cast<uint64_t>(rc.slots[k]));
    }
    tb.in_flight = rc.in_flight();
  }
  tb.add("cublaslt_workspace", "32 MiB", MB::kBuffers, kCudaMatmulWorkspaceBytes, 1, false);
  return tb;
}

// Sums a table by bucket: what the engine takes, and what its memory_bytes() counts.
EngineMemory sum_table(Table tb) {
  EngineMemory mem;
  mem.allocations = std::move(tb.rows);
  mem.in_flight = tb.in_flight;
  for (const EngineAllocation& a : mem.allocations) {
    const uint64_t bytes = a.bytes();
    switch (a.bucket) {
      case MemoryBucket::kWeights:
        mem.weights += bytes;
        break;
      case MemoryBucket::kGradients:
        mem.gradients += bytes;
        break;
      case MemoryBucket::kOptimizer:
        mem.optimizer += bytes;
        break;
      case MemoryBucket::kActivations:
        mem.activations += bytes;
        break;
      case MemoryBucket::kBuffers:
        mem.buffers += bytes;
        break;
    }
    mem.total += bytes;
    if (a.in_backend_bytes) mem.backend_bytes += bytes;
  }
  return mem;
}

}  // namespace

const char* engine_kind_name(EngineKind e) {
  switch (e) {
    case EngineKind::kGeneric:
      return "generic";
    case EngineKind::kGantryCpu:
      return "gantry-cpu";
    case EngineKind::kGantryCuda:
      return "gantry-cuda";
  }
  return "?";
}

Result<EngineKind> engine_kind_parse(std::string_view s) {
  if (s == "generic") return EngineKind::kGeneric;
  if (s == "gantry-cpu") return EngineKind::kGantryCpu;
  if (s == "gantry-cuda") return EngineKind::kGantryCuda;
  return Status::error("engine '" + std::string(s) + "': allowed generic, gantry-cpu, gantry-cuda");
}

const char* memory_bucket_name(MemoryBucket b) {
  switch (b) {
    case MemoryBucket::kWeights:
      return "weights";
    case MemoryBucket::kGradients:
      return "gradients";
    case MemoryBucket::kOptimizer:
      return "optimizer";
    case MemoryBucket::kActivations:
      return "activations";
    case MemoryBucket::kBuffers:
      return "buffers";
  }
  return "?";
}

Status plan_engine_validate(EngineKind e, const PlanModel& m) {
  if (e == EngineKind::kGeneric) return Status();
  Status s = plan_model_validate(m);
  if (!s.ok()) return s;
  const std::string who = std::string("engine ") + engine_kind_name(e) + ": ";
  if (m.ffn_kind != FfnKind::kGelu || plan_model_ffn(m) != 4 * m.hidden) {
    return Status::error(who + "trains GPT-2's MLP only (GELU, ffn = 4 x hidden)");
  }
  if (plan_model_kv_heads(m) != m.heads)
    return Status::error(who + "has no grouped-query attention (kv_heads = heads)");
  if (!m.tied_embeddings) return Status::error(who + "ties the output head to the embedding (no --untied)");
  if (m.positions != PositionKind::kLearned || m.norm != NormKind::kLayerNorm || !m.biases) {
    return Status::error(who + "trains GPT-2-shaped models only (learned positions, LayerNorm, biases)");
  }
  if (m.dropout) return Status::error(who + "has no dropout");
  if (e == EngineKind::kGantryCuda) {
    // The kernels' preconditions (kernels.cu layernorm and bias kernels, attention.cu check_shape).
    if (m.hidden % 8 != 0 || m.hidden > 2048) {
      return Status::error("model.hidden = " + std::to_string(m.hidden) + ": " + who +
                           "needs a multiple of 8, at most 2048 (its LayerNorm kernels)");
    }
    const int hs = m.hidden / m.heads;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128) {
      return Status::error("model.heads = " + std::to_string(m.heads) + ": " + who +
                           "needs a head size (hidden / heads) of 16, 32, 64 or 128, got " +
                           std::to_string(hs));
    }
  }
  return Status();
}

uint64_t CudaScratch::total() const {
  return std::max({layernorm, bias, attention_deterministic, attention_fast, global_norm});
}

CudaScratch plan_cuda_scratch_floats(const PlanModel& m, int micro_batch) {
  const uint64_t b = static_cast<uint64_t>(micro_batch), t = m.seq, c = m.hidden, nh = m.heads, n = b * t;
  CudaScratch s;
  s.layernorm = std::min(n, kNormPartials) * 3 * c;  // partial sums of dw, db and the fused bias gradient
  s.bias = std::max({bias_groups(n, c) * c, bias_groups(n, 3 * c) * 3 * c, bias_groups(n, 4 * c) * 4 * c});
  s.attention_deterministic = b * t * nh;
  // attention_backward_scratch_floats(B, T, NH, HS = C / NH): the fast scratch of every head size up to HS.
  const uint64_t hs = c / nh;
  for (uint64_t d : {16, 32, 64, 128}) {
    if (d <= hs) s.attention_fast = std::max(s.attention_fast, attention_fast_scratch(b, t, nh, d));
  }
  s.global_norm = kNormBlocks;
  return s;
}

namespace {

// Whether `schedule` runs pp x vp virtual stages with m micro-batches (pipeline_check's rules for the
// schedules' shapes): interleaving exactly when vp > 1, and then m a multiple of pp.
Status pipe_validate(int pp, int vp, int stage, int micro_batches, CudaPipeSchedule schedule) {
  const std::string at = "pipeline rank " + std::to_string(stage) + " of pp " + std::to_string(pp) +
                         " x vp " + std::to_string(vp) + " (" + std::to_string(micro_batches) +
                         " micro-batches): ";
  if (pp < 1 || vp < 1 || stage < 0 || stage >= pp || micro_batches < 1)
    return Status::error(at + "allowed 0 <= stage < pp, vp >= 1, micro-batches >= 1");
  if ((schedule == CudaPipeSchedule::kInterleaved) != (vp > 1)) {
    return Status::error(at +
                         "virtual stages run only under the interleaved schedule, and it needs them: vp > 1 "
                         "with interleaved, vp 1 with gpipe, 1f1b or zbh1");
  }
  if (vp > 1 && (pp < 2 || micro_batches % pp != 0))
    return Status::error(at + "interleaving needs pp > 1 and micro-batches a multiple of pp");
  return Status();
}

// Rank `stage`'s chunks of the backend's partition into pp x vp virtual stages (the CUDA one's with
// `cuda`) and the slots each holds.
Result<RankChunks> rank_chunks(const PlanModel& m, int pp, int vp, int stage, int micro_batches,
                               CudaPipeSchedule schedule, bool cuda) {
  if (static_cast<int64_t>(pp) * vp > m.layers) {
    return Status::error("pp " + std::to_string(pp) + " x vp " + std::to_string(vp) + " = " +
                         std::to_string(static_cast<int64_t>(pp) * vp) + " stages but the model has " +
                         std::to_string(m.layers) + " layers: every stage needs at least one");
  }
  Status s = pipe_validate(pp, vp, stage, micro_batches, schedule);
  if (!s.ok()) return s;
  const std::vector<int> v =
      cuda ? plan_cuda_pipeline_layers(m, pp * vp) : plan_cpu_pipeline_layers(m, pp * vp);
  RankChunks rc;
  for (int c = 0; c < vp; ++c) rc.layers.push_back(v[static_cast<size_t>(c * pp + stage)]);
  // One chunk: the closed form (checked against the replay in engine_profile_test); interleaved chunks have
  // none, their counts are the replayed program's.
  if (vp == 1) {
    rc.slots = {plan_cuda_pipeline_slots(pp, stage, micro_batches, schedule)};
  } else {
    rc.slots = plan_pipeline_chunk_slots(pp, vp, stage, micro_batches, schedule).value();
  }
  return rc;
}

}  // namespace

Result<EngineMemory> plan_engine_memory(EngineKind e, const PlanModel& m, int micro_batch, int tp) {
  if (e == EngineKind::kGeneric) return Status::error("engine generic: has no allocation table");
  Status s = plan_engine_validate(e, m);
  if (!s.ok()) return s;
  if (micro_batch < 1)
    return Status::error("micro_batch = " + std::to_string(micro_batch) + ": allowed >= 1");
  if (tp < 1 || m.heads % tp != 0 || m.vocab % tp != 0 || (4 * m.hidden) % tp != 0) {
    return Status::error("tp = " + std::to_string(tp) +
                         ": the engine's tensor parallel needs tp dividing the " + "heads (" +
                         std::to_string(m.heads) + "), the vocabulary (" + std::to_string(m.vocab) +
                         ") and 4 x hidden (" + std::to_string(4 * m.hidden) + ")");
  }
  const uint64_t b = static_cast<uint64_t>(micro_batch);
  return sum_table(e == EngineKind::kGantryCpu
                       ? cpu_table(m, b, static_cast<uint64_t>(tp), {})
                       : cuda_table(m, b, static_cast<uint64_t>(tp), 1, 0, {{m.layers}, {1}}, 1,
                                    CudaPipeSchedule::kOneFOneB));
}

Result<EngineMemory> plan_cuda_rank_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                           int micro_batches, bool gpipe, const CudaDataParallelPlan& dpp) {
  return plan_cuda_rank_memory(m, micro_batch, tp, pp, stage, micro_batches,
                               gpipe ? CudaPipeSchedule::kGpipe : CudaPipeSchedule::kOneFOneB, dpp);
}

Result<EngineMemory> plan_cuda_rank_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                           int micro_batches, CudaPipeSchedule schedule,
                                           const CudaDataParallelPlan& dpp, int vp, bool sequence_parallel) {
  Status s = plan_engine_validate(EngineKind::kGantryCuda, m);
  if (!s.ok()) return s;
  if (micro_batch < 1 || micro_batches < 1 || pp < 1 || pp > m.layers || stage < 0 || stage >= pp || tp < 1 ||
      m.heads % tp != 0 || m.vocab % tp != 0 || (4 * m.hidden) % tp != 0) {
    return Status::error(
        "gantry-cuda rank at stage " + std::to_string(stage) + " of pp " + std::to_string(pp) + " (tp " +
        std::to_string(tp) + ", micro-batch " + std::to_string(micro_batch) + " x " +
        std::to_string(micro_batches) +
        "): allowed 0 <= stage < pp <= layers, tp dividing heads, vocabulary and 4 x hidden, batches >= 1");
  }
  if (dpp.dp < 1 || dpp.rank < 0 || dpp.rank >= dpp.dp || dpp.zero < 0 || dpp.zero > 3 ||
      dpp.bucket_bytes < 1) {
    return Status::error("gantry-cuda rank at dp " + std::to_string(dpp.dp) + " (rank " +
                         std::to_string(dpp.rank) + ", zero " + std::to_string(dpp.zero) +
                         "): allowed 0 <= rank < dp, zero 0-3, bucket bytes >= 1");
  }
  Result<RankChunks> rc = rank_chunks(m, pp, vp, stage, micro_batches, schedule, true);
  if (!rc.ok()) return rc.status();
  return sum_table(cuda_table(m, static_cast<uint64_t>(micro_batch), static_cast<uint64_t>(tp), pp, stage,
                              rc.value(), static_cast<uint64_t>(micro_batches), schedule, dpp,
                              sequence_parallel));
}

Result<EngineMemory> plan_cpu_pipeline_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                              int micro_batches, bool gpipe) {
  return plan_cpu_pipeline_memory(m, micro_batch, tp, pp, stage, micro_batches,
                                  gpipe ? CudaPipeSchedule::kGpipe : CudaPipeSchedule::kOneFOneB);
}

namespace {
Status cpu_dp_validate(const CpuDataParallelPlan& dpp) {
  if (dpp.dp < 1 || dpp.rank < 0 || dpp.rank >= dpp.dp || dpp.zero < 0 || dpp.zero > 3 ||
      dpp.bucket_bytes < 1) {
    return Status::error("gantry-cpu rank at dp " + std::to_string(dpp.dp) + " (rank " +
                         std::to_string(dpp.rank) + ", zero " + std::to_string(dpp.zero) +
                         "): allowed 0 <= rank < dp, zero 0-3, bucket bytes >= 1");
  }
  return Status();
}
}  // namespace

Result<EngineMemory> plan_cpu_rank_memory(const PlanModel& m, int micro_batch, int tp,
                                          const CpuDataParallelPlan& dpp) {
  Result<EngineMemory> check = plan_engine_memory(EngineKind::kGantryCpu, m, micro_batch, tp);
  if (!check.ok()) return check;
  Status s = cpu_dp_validate(dpp);
  if (!s.ok()) return s;
  return sum_table(cpu_table(m, static_cast<uint64_t>(micro_batch), static_cast<uint64_t>(tp), dpp));
}

Result<EngineMemory> plan_cpu_pipeline_memory(const PlanModel& m, int micro_batch, int tp, int pp, int stage,
                                              int micro_batches, CudaPipeSchedule schedule,
                                              const CpuDataParallelPlan& dpp, int vp) {
  Status s = plan_engine_validate(EngineKind::kGantryCpu, m);
  if (!s.ok()) return s;
  if (micro_batch < 1 || micro_batches < 1 || pp < 1 || pp > m.layers || stage < 0 || stage >= pp || tp < 1 ||
      m.heads % tp != 0 || m.vocab % tp != 0) {
    return Status::error(
        "pipeline stage " + std::to_string(stage) + " of pp " + std::to_string(pp) + " (tp " +
        std::to_string(tp) + ", micro-batch " + std::to_string(micro_batch) + " x " +
        std::to_string(micro_batches) +
        "): allowed 0 <= stage < pp <= layers, tp dividing heads and vocabulary, batches >= 1");
  }
  s = cpu_dp_validate(dpp);
  if (!s.ok()) return s;
  Result<RankChunks> rc = rank_chunks(m, pp, vp, stage, micro_batches, schedule, false);
  if (!rc.ok()) return rc.status();
  return sum_table(cpu_pipeline_table(m, static_cast<uint64_t>(micro_batch), static_cast<uint64_t>(tp), pp,
                                      stage, rc.value(), static_cast<uint64_t>(micro_batches), schedule,
                                      dpp));
}

double plan_engine_compute_efficiency(EngineKind e, std::string_view gpu) {
  if (e == EngineKind::kGantryCuda && (gpu == "h100" || gpu == "h200")) return kGantryCudaHopperEfficiency;
  return 0;
}

// ---- CPU step time.

CpuRates plan_cpu_rates_default(int threads) {
  CpuRates r;
  // Gloo over loopback on the developer VM, 2026-11-27 (`--measure-cpu`, docs/PERF.md "Planner beside
  // measurement"): the quiet machine's ring step; under load a wake-up waits for a scheduler tick (4-6 ms).
  r.comm_latency_s = 150e-6;
  r.comm_bw = 0.7e9;
  // The host CPU of those collectives (process CPU time, `--measure-cpu` at 18:21 UTC on 2026-11-27, load
  // average 5: docs/PERF.md): per ring step a rank takes, per byte it sends.
  r.comm_cpu_step_s = 220e-6;
  r.comm_cpu_byte_s = 0.7e-9;
  if (threads == 1) {
    // One thread, timed by CPU time: the median of 5 `--measure-cpu --threads 1` runs on the developer VM,
    // 2026-11-27 (docs/PERF.md). No thread pool to wake.
    r.threads = 1;
    r.dot_flops = 14.6e9;
    r.axpy_flops = 4.65e9;
    r.attention_flops = 4.0e9;
    r.gelu_elements = 37e6;
    r.layernorm_elements = 195e6;
    r.softmax_elements = 200e6;
    r.optimizer_params = 160e6;
    r.parallel_for_s = 6e-9;
    return r;
  }
  // The developer VM (2-core AMD EPYC, 2 threads): the median of 25 `gantry-engine plan --engine gantry-cpu
  // --measure-cpu` runs on 2026-11-26, while other builds shared its cores (load average 3-6), so a quiet
  // VM is faster (docs/PERF.md, "Planner calibration against the engine").
  r.threads = 2;
  r.dot_flops = 18.7e9;
  r.axpy_flops = 4.61e9;
  r.attention_flops = 5.29e9;
  r.gelu_elements = 37.9e6;
  r.layernorm_elements = 251e6;
  r.softmax_elements = 190e6;
  r.optimizer_params = 196e6;
  r.parallel_for_s = 11.3e-6;
  return r;
}

Status plan_cpu_rates_validate(const CpuRates& r) {
  for (double v : {r.dot_flops, r.axpy_flops, r.attention_flops, r.gelu_elements, r.layernorm_elements,
                   r.softmax_elements, r.optimizer_params}) {
    if (!(v > 0)) return Status::error("CPU rates: every rate must be > 0 (measure them with --measure-cpu)");
  }
  if (!(r.parallel_for_s >= 0)) return Status::error("CPU rates: parallel_for_s must be >= 0");
  if (!(r.comm_latency_s >= 0) || !(r.comm_bw > 0)) {
    return Status::error("CPU rates: comm_latency_s must be >= 0 and comm_bw > 0 (Gloo over loopback)");
  }
  if (!(r.comm_cpu_step_s >= 0) || !(r.comm_cpu_byte_s >= 0)) {
    return Status::error(
        "CPU rates: comm_cpu_step_s and comm_cpu_byte_s must be >= 0 (the host CPU of a collective)");
  }
  if (r.threads < 1)
    return Status::error("CPU rates: threads must be >= 1 (the threads they were timed with)");
  return Status();
}

CpuWork plan_cpu_stage_work(const PlanModel& m, int micro_batch, int tp, int layers, bool first, bool last) {
  const double b = micro_batch, t = m.seq, c = m.hidden, l = layers;
  const double nh = static_cast<double>(m.heads) / tp, v = static_cast<double>(m.vocab) / tp;  // this rank's
  const double n = b * t, hs = c / m.heads;
  CpuWork w;
  const double blocks = (l * 2 * n * c * (3 * c + c + 4 * c + 4 * c)) / tp, logits = 2 * n * c * v;
  w.dot_flops = blocks + (last ? logits : 0);
  w.axpy_flops = 2 * blocks + (last ? logits : 0);  // d(input) and d(weight); the logits' d(input) only
  // Forward: q·k and the probability-weighted sum of v (2·hs each); backward: one dot and three axpys.
  w.attention_flops = l * 12 * hs * (b * nh * t * (t + 1) / 2);
  w.gelu_elements = l * n * 4 * c / tp;
  w.layernorm_elements = (2 * l + (last ? 1 : 0)) * n * c;
  w.softmax_elements = last ? n * v : 0;
  // backend_cpu.cpp: forward, per layer 4 matmuls and the attention, then the logits and the softmax;
  // backward, the softmax, the logits' two loops (rows, weight columns), per layer 4 matmuls of two loops
  // each and the attention.
  w.parallel_calls = l * (5 + 9) + (last ? 2 + 3 : 0);
  // Parameters (rank_tensors' split) and tensors (gpt_param_table's) this stage updates.
  const uint64_t ct = static_cast<uint64_t>(m.hidden), ut = static_cast<uint64_t>(tp);
  const uint64_t layer = 2 * ct + (3 * ct * ct + 3 * ct) / ut + ct * ct / ut + ct + 2 * ct +
                         (4 * ct * ct + 4 * ct) / ut + 4 * ct * ct / ut + ct;
  uint64_t params = static_cast<uint64_t>(layers) * layer, tensors = 12 * static_cast<uint64_t>(layers);
  if (first)
    params += static_cast<uint64_t>(m.vocab) / ut * ct + static_cast<uint64_t>(m.seq) * ct, tensors += 2;
  if (last) params += 2 * ct, tensors += 2;
  w.params = static_cast<double>(params);
  w.optimizer_parallel_calls = 1 + static_cast<double>(tensors);  // grad_norm, then AdamW
  return w;
}

double plan_cpu_classifier_wgrad_flops(const PlanModel& m, int micro_batch, int tp) {
  return 2.0 * micro_batch * m.seq * m.hidden * (static_cast<double>(m.vocab) / tp);
}

CpuWork plan_cpu_work(const PlanModel& m, int micro_batch, int tp) {
  CpuWork w = plan_cpu_stage_work(m, micro_batch, tp, m.layers, true, true);
  w.axpy_flops += plan_cpu_classifier_wgrad_flops(m, micro_batch, tp);
  return w;
}

namespace {
// parallel/pipeline_schedule.cpp pipeline_partition: the classifier's forward and input gradient on the
// last stage, its weight gradient on stage 0 (`grad_last` false: the CPU pipeline) or on the last (the CUDA
// backend's ClassifierGradStage::kLast).
std::vector<int> pipeline_layers(const PlanModel& m, int stages, bool grad_last) {
  const int L = m.layers;
  const double c = m.hidden, t = m.seq, block = 3.0 * (24.0 * c * c + 4.0 * t * c), vc = 2.0 * m.vocab * c;
  auto extra = [&](int stage) {
    return (stage == (grad_last ? stages - 1 : 0) ? vc : 0) + (stage == stages - 1 ? 2 * vc : 0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(L + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int l = s; l <= L; ++l) {
      for (int k = s - 1; k < l; ++k) {  // stage s-1 holds layers k..l-1
        if (best[s - 1][k] == inf) continue;
        const double cost = std::max(best[s - 1][k], (l - k) * block + extra(s - 1));
        if (cost < best[s][l]) best[s][l] = cost, cut[s][l] = k;
      }
    }
  }
  std::vector<int> layers(static_cast<size_t>(std::max(stages, 0)), 0);
  if (stages < 1 || stages > L) return layers;
  for (int s = stages, l = L; s >= 1; --s) {
    const int k = cut[s][l];
    layers[static_cast<size_t>(s - 1)] = l - k;
    l = k;
  }
  return layers;
}
}  // namespace

std::vector<int> plan_cpu_pipeline_layers(const PlanModel& m, int stages) {
  return pipeline_layers(m, stages, false);
}

std::vector<int> plan_cuda_pipeline_layers(const PlanModel& m, int stages) {
  return pipeline_layers(m, stages, true);
}

PipelineSchedule plan_pipeline_schedule(CudaPipeSchedule s) {
  switch (s) {
    case CudaPipeSchedule::kGpipe:
      return PipelineSchedule::kGpipe;
    case CudaPipeSchedule::kZeroBubbleH1:
      return PipelineSchedule::kZeroBubbleH1;
    case CudaPipeSchedule::kInterleaved:
      return PipelineSchedule::kInterleaved;
    case CudaPipeSchedule::kOneFOneB:
      break;
  }
  return PipelineSchedule::kOneFOneB;
}

Result<std::vector<int>> plan_pipeline_chunk_slots(int pp, int vp, int stage, int micro_batches,
                                                   CudaPipeSchedule schedule) {
  Status s = pipe_validate(pp, vp, stage, micro_batches, schedule);
  if (!s.ok()) return s;
  const PipelineSchedule ps = plan_pipeline_schedule(schedule);
  return pipeline_program_slots(pipeline_program(ps, pp, vp, stage, micro_batches), stage, vp, micro_batches,
                                ps == PipelineSchedule::kZeroBubbleH1);
}

int plan_pipeline_slots(int pp, int stage, int micro_batches, bool gpipe) {
  if (gpipe) return micro_batches;
  return std::min(micro_batches, pp - stage + (stage > 0 ? 1 : 0));
}

int plan_cpu_pipeline_slots(int pp, int stage, int micro_batches, CudaPipeSchedule schedule) {
  // backend_cpu_pipeline.cpp's acquire() and release() follow the GPU's rules (a slot taken at an
  // activation's receive or stage 0's forward, freed at the gradient's send, or under ZB-H1 at the weight
  // pass): the same counts, replayed for the CPU in tests/engine/plan/engine_profile_test.cpp.
  return plan_cuda_pipeline_slots(pp, stage, micro_batches, schedule);
}

int plan_cuda_pipeline_slots(int pp, int stage, int micro_batches, CudaPipeSchedule schedule) {
  // ZB-H1 frees a slot after its weight pass, not at its input gradient's send: every stage holds as
  // many as the warm-up's depth, pp, once m reaches it.
  if (schedule == CudaPipeSchedule::kZeroBubbleH1) return std::min(micro_batches, pp);
  return plan_pipeline_slots(pp, stage, micro_batches, schedule == CudaPipeSchedule::kGpipe);
}

CpuStep plan_cpu_step(const CpuWork& w, const CpuRates& r, int micro_batches) {
  CpuStep s;
  const double mb = micro_batches;
  s.matmul_s = mb * (w.dot_flops / r.dot_flops + w.axpy_flops / r.axpy_flops);
  s.attention_s = mb * w.attention_flops / r.attention_flops;
  s.elementwise_s = mb * (w.gelu_elements / r.gelu_elements + w.layernorm_elements / r.layernorm_elements +
                          w.softmax_elements / r.softmax_elements);
  s.optimizer_s = w.params / r.optimizer_params;
  s.dispatch_s = (mb * w.parallel_calls + w.optimizer_parallel_calls) * r.parallel_for_s;
  return s;
}

}  // namespace gantry
