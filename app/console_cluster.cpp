// The embedded local cluster of `gantry` without arguments: `gantry-engine up` and `down`, run as child
// processes exactly as an operator would type them.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "app/console_parts.h"
#include "app/file_text.h"
#include "engine/cluster/api_client.h"
#include "engine/cluster/token.h"

namespace gantry {
namespace {

namespace fs = std::filesystem;

std::string first_line(std::string s) {
  const size_t k = s.find('\n');
  if (k != std::string::npos) s.resize(k);
  return s;
}

// Runs `engine args...` with stdin from /dev/null and stdout and stderr into files; returns its exit code.
Result<int> run_engine(const std::string& engine, const std::vector<std::string>& args, const fs::path& out,
                       const fs::path& err) {
  std::vector<std::string> all = {engine};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return Status::error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    const int in = ::open("/dev/null", O_RDONLY);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || o < 0 || e < 0) ::_exit(127);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::error(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && !fs::exists(engine))
    return Status::error("cannot run " + engine + ": no such file (gantry-engine must sit beside gantry)");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

std::string console_engine_path() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ((ec ? fs::path(".") : self.parent_path()) / "gantry-engine").string();
}

std::string console_state_dir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && x[0] == '/')
    return std::string(x) + "/gantry";
  if (const char* h = std::getenv("HOME"); h != nullptr && h[0] != '\0')
    return std::string(h) + "/.local/state/gantry";
  return "/tmp/gantry-" + std::to_string(::getuid());
}

Result<console::Endpoint> console_cluster_up(const std::string& engine, const std::string& dir, int nodes,
                                             int slots, bool* started) {
  *started = false;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::error("cannot create the local cluster's folder " + dir + ": " + ec.message());
  // A cluster already answering in this folder (another console's, or one left running) is used as it is.
  const fs::path url_file = fs::path(dir) / "url", token_file = fs::path(dir) / "token";
  if (fs::exists(url_file) && fs::exists(token_file)) {
    const std::string url = first_line(file_text_read(url_file));
    Result<std::string> token = token_file_read(token_file.string());
    if (token.ok() && !url.empty()) {
      ApiClient probe({.url = url,
                       .token = token.value(),
                       .connect_timeout = std::chrono::milliseconds(1000),
                       .timeout = std::chrono::milliseconds(3000)});
      if (probe.cluster().ok()) return console::Endpoint{url, token.value()};
    }
  }
  const fs::path out = fs::path(dir) / "up.out", err = fs::path(dir) / "up.err";
  Result<int> code = run_engine(
      engine, {"up", "--nodes", std::to_string(nodes), "--slots", std::to_string(slots), "--dir", dir}, out,
      err);
  if (!code.ok()) return code.status();
  if (code.value() != 0) {
    return Status::error("`gantry-engine up` failed (exit " + std::to_string(code.value()) +
                         "): " + first_line(file_text_read(err)) + " (logs in " + dir + ")");
  }
  *started = true;
  const std::string url = first_line(file_text_read(out));
  Result<std::string> token = token_file_read(token_file.string());
  if (!token.ok())
    return Status::error("the local cluster started but its token is unreadable: " + token.error());
  return console::Endpoint{url, token.value()};
}

Status console_cluster_down(const std::string& engine, const std::string& dir) {
  const fs::path out = fs::path(dir) / "down.out", err = fs::path(dir) / "down.err";
  Result<int> code = run_engine(engine, {"down", "--dir", dir}, out, err);
  if (!code.ok()) return code.status();
  if (code.value() != 0)
    return Status::error("`gantry-engine down --dir " + dir + "` failed: " + first_line(file_text_read(err)));
  return Status();
}

}  // namespace gantry
