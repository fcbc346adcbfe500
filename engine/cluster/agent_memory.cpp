#include "engine/cluster/agent_memory.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "engine/cluster/http_client.h"
#include "engine/core/checkpoint.h"  // checkpoint_list, checkpoint_dir_step: the copies are checkpoints

namespace gantry {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08" PRId64, step);
  return buf;
}

std::string shard_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard_r%05d.bin", rank);
  return buf;
}

Status write_whole(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return Status::error("cannot write " + path.string());
  return {};
}

// `file` of a copy from the agent at base_url.
Result<std::string> fetch(const std::string& base_url, const std::string& token, int64_t run, int rank,
                          int64_t step, const std::string& file) {
  HttpClient client({.url = base_url, .token = token, .peer = "agent " + base_url});
  const std::string path = "/v1/memory/" + std::to_string(run) + "/" + std::to_string(rank) + "/" +
                           std::to_string(step) + "/" + file;
  Result<HttpReply> r = client.get(path);
  if (!r.ok()) return Status::error("GET " + base_url + path + ": " + r.error());
  if (!r->ok())
    return Status::error("GET " + base_url + path + ": " + std::to_string(r->status) + " " +
                         r->error_message());
  return std::move(r->body);
}

// Keeps the newest `keep` committed steps under a rank's folder.
void prune(const fs::path& rank_dir, size_t keep) {
  std::error_code ec;
  const std::vector<std::string> committed = checkpoint_list(rank_dir.string());
  for (size_t i = 0; i + keep < committed.size(); ++i) fs::remove_all(committed[i], ec);
}

bool pid_alive(int64_t pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

}  // namespace

AgentMemory::AgentMemory(std::string root, const std::string& node, const std::string& agent_dir,
                         std::string token)
    : root_(std::move(root)), token_(std::move(token)) {
  std::error_code ec;
  if (root_.empty()) {
    if (fs::is_directory("/dev/shm", ec)) {
      // A killed agent cannot remove its folder: the next agent on the machine does, once its pid is gone.
      static const std::regex kOurs(R"(gantry-agent-.+-(\d+))");
      for (const fs::directory_entry& e : fs::directory_iterator("/dev/shm", ec)) {
        std::smatch m;
        const std::string name = e.path().filename().string();
        if (std::regex_match(name, m, kOurs) && !pid_alive(std::stoll(m[1].str())))
          fs::remove_all(e.path(), ec);
      }
      root_ = "/dev/shm/gantry-agent-" + node + "-" + std::to_string(::getpid());
    } else {
      root_ = agent_dir + "/memory";
    }
  }
  fs::create_directories(root_, ec);
}

AgentMemory::~AgentMemory() {
  std::error_code ec;
  fs::remove_all(root_, ec);
}

std::string AgentMemory::run_dir(int64_t run) const {
  return root_ + "/run-" + std::to_string(run);
}

json AgentMemory::held() {
  json out = json::array();
  std::error_code ec;
  static const std::regex kRun(R"(run-(\d+))"), kRank(R"(rank-(\d+))");
  for (const fs::directory_entry& r : fs::directory_iterator(root_, ec)) {
    std::smatch rm;
    const std::string rname = r.path().filename().string();
    if (!std::regex_match(rname, rm, kRun)) continue;
    std::error_code ec2;
    for (const fs::directory_entry& k : fs::directory_iterator(r.path(), ec2)) {
      std::smatch km;
      const std::string kname = k.path().filename().string();
      if (!std::regex_match(kname, km, kRank)) continue;
      for (const std::string& dir : checkpoint_list(k.path().string())) {
        const std::string manifest = dir + "/manifest.json";
        int world = 0;
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = worlds_.find(manifest);
          if (it != worlds_.end()) {
            world = it->second;
          } else {
            std::ifstream in(manifest);
            json m = json::parse(in, nullptr, /*allow_exceptions=*/false);
            if (m.is_object() && m.contains("layout") && m["layout"].is_object())
              world = m["layout"].value("world_size", 0);
            if (world > 0) worlds_[manifest] = world;
          }
        }
        if (world <= 0) continue;
        out.push_back({{"run", std::stoll(rm[1].str())},
                       {"rank", std::stoi(km[1].str())},
                       {"step", checkpoint_dir_step(dir)},
                       {"world", world}});
      }
    }
  }
  {
    // Forget manifests gone with their folders, so the cache stays as small as the copies.
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(worlds_, [](const auto& kv) {
      std::error_code e;
      return !fs::exists(kv.first, e);
    });
  }
  return out;
}

HttpResponse AgentMemory::serve(const HttpRequest& req) const {
  static const std::regex kNum(R"(\d{1,18})"), kFile(R"(manifest\.json|shard_r\d{5}\.bin)");
  const std::string &run = req.param("run"), &rank = req.param("rank"), &step = req.param("step"),
                    &file = req.param("file");
  if (!std::regex_match(run, kNum) || !std::regex_match(rank, kNum) || !std::regex_match(step, kNum))
    return HttpResponse::error(400, "run, rank and step must be non-negative integers");
  if (!std::regex_match(file, kFile))
    return HttpResponse::error(
        400, "file must be manifest.json or shard_rNNNNN.bin, got \"" + file.substr(0, 64) + "\"");
  const fs::path path = fs::path(run_dir(std::stoll(run))) / ("rank-" + std::to_string(std::stoi(rank))) /
                        step_name(std::stoll(step)) / file;
  std::ifstream in(path, std::ios::binary);
  if (!in) return HttpResponse::error(404, "no in-memory copy " + path.string() + " on this node");
  std::ostringstream body;
  body << in.rdbuf();
  HttpResponse r;
  r.text = body.str();
  r.content_type = "application/octet-stream";
  return r;
}

Status AgentMemory::pull(const json& order) {
  const int64_t run = order.at("run").get<int64_t>(), step = order.at("step").get<int64_t>();
  const int rank = order.at("rank").get<int>();
  const std::string url = order.at("url").get<std::string>();
  const fs::path rank_dir = fs::path(run_dir(run)) / ("rank-" + std::to_string(rank));
  const fs::path dir = rank_dir / step_name(step), staging = rank_dir / ("." + step_name(step) + ".pulling");
  std::error_code ec;
  if (fs::exists(dir / "manifest.json", ec)) return {};  // taken already
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) return Status::error("cannot create " + staging.string() + ": " + ec.message());
  // The shard first and the manifest last, then the rename: a folder named step_* with a manifest is whole.
  for (const std::string& file : {shard_name(rank), std::string("manifest.json")}) {
    Result<std::string> bytes = fetch(url, token_, run, rank, step, file);
    Status s = bytes.ok() ? write_whole(staging / file, bytes.value()) : bytes.status();
    if (!s.ok()) {
      fs::remove_all(staging, ec);
      return s;
    }
  }
  fs::rename(staging, dir, ec);
  if (ec) return Status::error("cannot rename " + staging.string() + ": " + ec.message());
  prune(rank_dir, 2);
  return {};
}

void AgentMemory::drop(int64_t run) {
  std::error_code ec;
  fs::remove_all(run_dir(run), ec);
  fs::remove_all(fs::path(root_) / "restore" / ("run-" + std::to_string(run)), ec);
}

Result<std::string> AgentMemory::assemble(int64_t run, const json& restore) {
  try {
    const int64_t step = restore.at("step").get<int64_t>();
    const fs::path base = fs::path(root_) / "restore" / ("run-" + std::to_string(run));
    const fs::path dir = base / step_name(step), staging = base / ("." + step_name(step) + ".assembling");
    std::error_code ec;
    fs::remove_all(base, ec);  // an earlier recovery's set: only the newest is kept
    fs::create_directories(staging, ec);
    if (ec) return Status::error("cannot create " + staging.string() + ": " + ec.message());
    bool manifest = false;
    for (const json& s : restore.at("shards")) {
      const int rank = s.at("rank").get<int>();
      const std::string url = s.at("url").get<std::string>();
      Result<std::string> bytes = fetch(url, token_, run, rank, step, shard_name(rank));
      if (!bytes.ok()) return bytes.status();
      if (Status w = write_whole(staging / shard_name(rank), bytes.value()); !w.ok()) return w;
      if (!manifest) {
        Result<std::string> m = fetch(url, token_, run, rank, step, "manifest.json");
        if (!m.ok()) return m.status();
        if (Status w = write_whole(staging / "manifest.json", m.value()); !w.ok()) return w;
        manifest = true;
      }
    }
    fs::rename(staging, dir, ec);
    if (ec) return Status::error("cannot rename " + staging.string() + ": " + ec.message());
    return dir.string();
  } catch (const json::exception& e) {
    return Status::error(std::string("a malformed memory_restore: ") + e.what());
  }
}

}  // namespace gantry
