#include "engine/core/sdc_check.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/core/backend.h"
#include "engine/core/comm/communicator.h"
#include "engine/core/train.h"
#include "engine/core/xxhash64.h"  // xxhash64_hex: hashes are shown as 16 hex digits
#include "telemetry/host.h"

namespace gantry {

SdcVerdict sdc_judge(const std::vector<uint64_t>& hashes) {
  SdcVerdict v;
  const int n = static_cast<int>(hashes.size());
  std::map<uint64_t, int> count;
  for (uint64_t h : hashes) ++count[h];
  for (const auto& [h, k] : count) {
    if (2 * k > n) {
      v.majority = true;
      v.majority_hash = h;
      v.agreeing = k;
    }
  }
  v.mismatch = count.size() > 1;
  if (!v.mismatch) return v;
  for (int r = 0; r < n; ++r) {
    // Without a majority nobody can tell which copy is right: every replica is suspect.
    if (!v.majority || hashes[static_cast<size_t>(r)] != v.majority_hash) v.suspects.push_back(r);
  }
  return v;
}

void sdc_hash_encode(uint64_t hash, float* slots) {
  for (int k = 0; k < kSdcFloatsPerHash; ++k) slots[k] = static_cast<float>((hash >> (16 * k)) & 0xffffu);
}

uint64_t sdc_hash_decode(const float* slots) {
  uint64_t h = 0;
  for (int k = 0; k < kSdcFloatsPerHash; ++k) {
    const float f = std::clamp(slots[k], 0.0f, 65535.0f);  // only a broken sum leaves the range
    h |= static_cast<uint64_t>(f) << (16 * k);
  }
  return h;
}

bool SdcMismatch::named(int global_rank) const {
  return std::find(suspect_ranks.begin(), suspect_ranks.end(), global_rank) != suspect_ranks.end();
}

SdcCheck::SdcCheck(int every, const ParallelDims& dims, Communicator* dp, std::chrono::milliseconds timeout,
                   Backend& backend, int64_t test_flip_bit_step)
    : every_(every),
      dims_(dims),
      dp_(dp),
      timeout_(timeout),
      backend_(backend),
      test_flip_bit_step_(test_flip_bit_step),
      state_(backend.replicated_state()) {
  enabled_ = every_ > 0 && dims_.dp > 1 && dp_ != nullptr && !state_.empty();
}

std::string SdcCheck::describe() const {
  if (every_ <= 0) return "sdc check: off (train.sdc_check_every = 0)";
  if (dims_.dp <= 1 || dp_ == nullptr)
    return "sdc check: off (one data-parallel replica: nothing to compare)";
  if (state_.empty()) {
    return "sdc check: off (" +
           std::string(dims_.zero >= 3 ? "ZeRO 3 shards the parameters: no state is replicated"
                                       : "the " + backend_.name() + " backend has no replica checksum") +
           ")";
  }
  char buf[200];
  std::snprintf(buf, sizeof buf, "sdc check: every %d steps, the %s (%.3f MB) compared over %d dp replicas",
                every_, state_.c_str(), static_cast<double>(backend_.replicated_bytes()) / 1e6, dims_.dp);
  return buf;
}

Status SdcCheck::after_step(int64_t step) {
  if (test_flip_bit_step_ > 0 && step == test_flip_bit_step_) {
    // A bit in the middle of the state: one replica's copy now differs from the others'.
    const uint64_t bytes = backend_.replicated_bytes();
    const uint64_t bit = (bytes / 2) * 8 + 5;
    if (bytes == 0 || !backend_.test_flip_replicated_bit(bit)) {
      return Status::error("test fault flip_bit: the " + backend_.name() +
                           " backend holds no replicated state to corrupt at ZeRO " +
                           std::to_string(dims_.zero));
    }
    std::fprintf(
        stderr, "gantry-engine worker (rank %d): test fault: flipped bit %llu of the %s after step %lld\n",
        dims_.rank, static_cast<unsigned long long>(bit), state_.c_str(), static_cast<long long>(step));
  }
  if (!enabled_ || step % every_ != 0) return {};
  return check(step);
}

Result<std::vector<std::string>> SdcCheck::exchange_hosts(const std::vector<int>& dp_ranks) {
  // Host names as bytes in floats, each rank in its own slots (as the hashes travel); only on a mismatch.
  constexpr size_t kHostBytes = 64;
  std::vector<float> v(kHostBytes * static_cast<size_t>(dims_.dp), 0.0f);
  const std::string me = host_name();
  const size_t at = kHostBytes * static_cast<size_t>(dims_.dp_rank());
  for (size_t k = 0; k < std::min(me.size(), kHostBytes - 1); ++k)
    v[at + k] = static_cast<float>(static_cast<unsigned char>(me[k]));
  if (Status st = dp_->all_reduce_host(v.data(), v.size(), timeout_); !st.ok()) return st;
  std::vector<std::string> hosts;
  for (int r : dp_ranks) {
    std::string h;
    for (size_t k = 0; k < kHostBytes; ++k) {
      const float f = v[kHostBytes * static_cast<size_t>(r) + k];
      if (!(f >= 1.0f && f <= 255.0f)) break;
      h += static_cast<char>(static_cast<unsigned char>(f));
    }
    hosts.push_back(h);
  }
  return hosts;
}

Status SdcCheck::check(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  const int dp = dims_.dp;
  std::vector<float> slots(static_cast<size_t>(kSdcFloatsPerHash) * dp, 0.0f);
  const uint64_t mine = backend_.replicated_hash();
  hash_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sdc_hash_encode(mine, slots.data() + static_cast<size_t>(kSdcFloatsPerHash) * dims_.dp_rank());
  if (Status st = dp_->all_reduce_host(slots.data(), slots.size(), timeout_); !st.ok()) return st;
  std::vector<uint64_t> hashes(static_cast<size_t>(dp));
  for (int r = 0; r < dp; ++r)
    hashes[static_cast<size_t>(r)] = sdc_hash_decode(slots.data() + kSdcFloatsPerHash * r);
  const SdcVerdict v = sdc_judge(hashes);
  ++checks_;
  check_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!v.mismatch) {
    last_passed_ = step;
    return {};
  }

  SdcMismatch m;
  m.step = step;
  m.rank = dims_.rank;
  m.verdict = v;
  m.state = state_;
  m.bytes = backend_.replicated_bytes();
  m.replicas = dp;
  m.last_passed_step = last_passed_;
  const std::vector<int> group = dims_.dp_group();
  Result<std::vector<std::string>> hosts = exchange_hosts(v.suspects);
  for (size_t k = 0; k < v.suspects.size(); ++k) {
    const int r = v.suspects[k];
    m.suspect_ranks.push_back(group[static_cast<size_t>(r)]);
    m.suspect_hosts.push_back(hosts.ok() ? hosts.value()[k] : "");
    m.suspect_hashes.push_back(hashes[static_cast<size_t>(r)]);
  }
  auto who = [&](size_t k) {
    const std::string& h = m.suspect_hosts[k];
    return "rank " + std::to_string(m.suspect_ranks[k]) + " (host " + (h.empty() ? "unknown" : h) +
           ", hash " + xxhash64_hex(m.suspect_hashes[k]) + ")";
  };
  std::string named;
  for (size_t k = 0; k < m.suspect_ranks.size(); ++k)
    named += (k == 0 ? "" : k + 1 == m.suspect_ranks.size() ? " and " : ", ") + who(k);
  char size[48];
  std::snprintf(size, sizeof size, "%.3f MB", static_cast<double>(m.bytes) / 1e6);
  std::string what;
  if (v.majority) {
    what = "the " + state_ + " (" + size + ") of " + named + " differ from the " +
           std::to_string(v.agreeing) + " of " + std::to_string(dp) + " replicas that agree (" +
           xxhash64_hex(v.majority_hash) + ")";
  } else {
    what = "the " + std::to_string(dp) + " replicas' " + state_ + " (" + size +
           ") disagree with no majority, so no replica can be trusted: " + named;
  }
  const std::string resume_from = last_passed_ >= 0
                                      ? "a checkpoint of step " + std::to_string(last_passed_) +
                                            " or earlier (the last check every replica passed)"
                                      : "a checkpoint from before this run (no check passed in this run)";
  m.message = "step " + std::to_string(step) + ": silent data corruption: " + what +
              "; stopping the run: resume from " + resume_from +
              (v.majority ? ", without the named node" : "") +
              " (on a cluster the coordinator recovers the run so by itself)";

  nlohmann::json j = {{"replicas", dp},           {"majority", v.majority},
                      {"agreeing", v.agreeing},   {"state", state_},
                      {"bytes", m.bytes},         {"suspects", m.suspect_ranks},
                      {"hosts", m.suspect_hosts}, {"last_passed_step", last_passed_}};
  if (v.majority) j["majority_hash"] = xxhash64_hex(v.majority_hash);
  nlohmann::json hs = nlohmann::json::array();
  for (uint64_t h : m.suspect_hashes) hs.push_back(xxhash64_hex(h));
  j["suspect_hashes"] = hs;
  m.payload = j.dump();
  found_ = std::move(m);
  return {};
}

Status SdcCheck::stop(TrainObserver* observer) {
  if (!found_) return {};
  if (observer != nullptr) observer->on_sdc_mismatch(*found_);
  // Every rank's report is out before any rank leaves: a peer's early exit could end the gang first. A
  // failed barrier changes nothing: the run stops for the mismatch either way.
  (void)dp_->barrier(timeout_);
  return Status::error(found_->message);
}

}  // namespace gantry
