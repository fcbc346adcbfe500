// A real history file for the history panel's tests, written through storage's own API as a training
// process writes it: runs, their step records (and, for some, every rank's step record), a finish.
#pragma once

#include <unistd.h>  // getpid: a file of this process's own

#include <cmath>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "storage/history_db.h"
#include "tests/scratch_dir.h"

namespace gantry::history::testing_support {

class TestHistory {
 public:
  explicit TestHistory(const std::string& tag) {
    dir_ = gantry::testing_support::scratch_dir("history_" + tag);
    std::string error;
    db_ = HistoryDb::open(path(), {}, &error);
    if (!db_) throw std::runtime_error(error);
  }
  ~TestHistory() {
    db_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string path() const { return (dir_ / "history.sqlite").string(); }
  HistoryDb& db() { return *db_; }

  int64_t begin(const std::string& name, int32_t world, const std::string& layout, double created) {
    return db_->begin_run({.name = name, .world_size = world, .layout = layout, .created_unix_s = created});
  }

  // Steps [first, first + losses.size()) with these losses, one batch per step as a trainer writes them;
  // with rank_steps, every rank's record of the step too.
  bool write(int64_t run, int64_t first, const std::vector<double>& losses, int32_t world, bool rank_steps) {
    for (size_t i = 0; i < losses.size(); ++i) {
      RecordBatch b;
      const int64_t step = first + static_cast<int64_t>(i);
      StepRecord& s = b.steps.emplace_back();
      s.run_id = run;
      s.step = step;
      s.time_unix_s = 1.7e9 + static_cast<double>(step);
      s.loss = losses[i];
      s.step_s = 0.1;
      if (rank_steps) {
        for (int32_t r = 0; r < world; ++r) {
          RankStepRecord& rs = b.rank_steps.emplace_back();
          rs.run_id = run;
          rs.step = step;
          rs.rank = r;
          rs.total_s = 0.1;
        }
      }
      if (!db_->ingest(b)) return false;
    }
    return true;
  }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<HistoryDb> db_;
};

}  // namespace gantry::history::testing_support
