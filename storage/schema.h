// The history database's schema as an ordered list of migrations, keyed on PRAGMA user_version: version
// N is what migrations 1..N build. Every schema change is a new migration appended to the list (never an
// edit of a shipped one), so any older file upgrades step by step. Each migration runs in its own
// transaction together with its user_version bump: a failure leaves the file at the previous version.
//
//   std::string error;
//   if (!schema_migrate(db, schema_migrations(), schema_latest_version(), &error)) return fail(error);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct sqlite3;

namespace gantry {

// PRAGMA application_id of a history file ("GNTY"), so a stranger's SQLite file is refused, not altered.
inline constexpr int32_t kHistoryApplicationId = 0x474E5459;

struct Migration {
  int version;      // the user_version after it
  const char* sql;  // one or more statements
};

const std::vector<Migration>& schema_migrations();
int schema_latest_version();

// PRAGMA user_version of an open database; -1 on error.
int schema_version(sqlite3* db);

// Applies migrations[i] for every version in (current, target], in order. Refuses a file whose version
// is above the newest migration known, a file that has tables but is not ours, and gaps in the list.
bool schema_migrate(sqlite3* db, const std::vector<Migration>& migrations, int target, std::string* error);

}  // namespace gantry
