// nn/atomic_file.h: the one writer behind every atomic write of the library (Note [Temporary
// files of a save]). save_safetensors's own cases (test_safetensors.cpp) cover the concurrent,
// killed and failing writes; these check the byte-string path that the sharded checkpoint's
// index and the metrics log take.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "nn/atomic_file.h"
#include "tests/dead_pid.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("atomic file: write_file_atomically replaces the file, keeps its mode, writes through a link") {
  ScratchDir dir("frugal_atomic_file_write");
  const fs::path path = dir.path / "index.json";
  nn::write_file_atomically(path.string(), "first", "test");
  CHECK(read_file(path) == "first");
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  nn::write_file_atomically(path.string(), std::string("sec\0nd", 6), "test");  // bytes, not a C string
  CHECK(read_file(path) == std::string("sec\0nd", 6));
  CHECK((fs::status(path).permissions() & fs::perms::mask) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  const fs::path link = dir.path / "link.json";
  fs::create_symlink(path, link);
  nn::write_file_atomically(link.string(), "third", "test");
  CHECK(fs::is_symlink(link));
  CHECK(read_file(path) == "third");
  CHECK(listing(dir.path) == std::vector<std::string>{"index.json", "link.json"});  // no temporary left
}

TEST_CASE("atomic file: errors name the op, the step, the temporary, the reason and what became of the path") {
  ScratchDir dir("frugal_atomic_file_errors");
  const fs::path missing = dir.path / "no" / "index.json";
  check_error([&] { nn::write_file_atomically(missing.string(), "x", "save_sharded_checkpoint"); },
              {"save_sharded_checkpoint: cannot create " + missing.string() + ".tmp.", "No such file",
               missing.string() + " was not created"});
  const fs::path fifo = dir.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  check_error([&] { nn::write_file_atomically(fifo.string(), "x", "op"); },
              {"op: ", fifo.string(), "is a FIFO", "never replaces it"});
  const fs::path path = dir.path / "log.csv";
  write_file(path, "old");
  if (::geteuid() != 0) {  // root writes anywhere
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    check_error([&] { nn::write_file_atomically(path.string(), "new", "MetricsLog: x"); },
                {"MetricsLog: x: cannot create " + path.string() + ".tmp.", "Permission denied",
                 path.string() + " is unchanged"});
    fs::permissions(dir.path, fs::perms::owner_all);
  }
  CHECK(read_file(path) == "old");
}

TEST_CASE("atomic file: a writer dropped before commit leaves the old file and no temporary") {
  ScratchDir dir("frugal_atomic_file_drop");
  const fs::path path = dir.path / "model.bin";
  write_file(path, "old");
  {
    nn::AtomicFileWriter file(path.string(), "test");
    file.write("new bytes");
    CHECK(fs::exists(file.temporary_path()));
    CHECK(file.temporary_path().rfind(path.string() + ".tmp." + std::to_string(::getpid()) + ".", 0) == 0);
  }
  CHECK(read_file(path) == "old");
  CHECK(listing(dir.path) == std::vector<std::string>{"model.bin"});
}

TEST_CASE("atomic file: a write removes the leftovers of killed writes of its path, not a live writer's") {
  // write_atomically (sharded checkpoint) and replace_file (metrics log) once left theirs for good.
  ScratchDir dir("frugal_atomic_file_leftovers");
  const fs::path path = dir.path / "index.json";
  const pid_t gone = dead_pid();
  const std::string stale = "index.json.tmp." + std::to_string(gone) + ".0123456789abcdef";
  const std::string live = "index.json.tmp." + std::to_string(::getpid()) + ".0123456789abcdef";
  for (const std::string& name : {stale, live}) write_file(dir.path / name, "partial");
  nn::write_file_atomically(path.string(), "{}", "test");
  CHECK(listing(dir.path) == std::vector<std::string>{"index.json", live});
  CHECK(read_file(path) == "{}");
}

// A probe of 2026-12-05: a dangling link was replaced by the file (weakly_canonical gave the
// link's own path) where open("wb") creates its target; a writer used after commit() said the
// file "was not created"; an empty path got as far as the rename.
TEST_CASE("atomic file: a dangling link's target is created, the link kept; misuse is refused by name") {
  ScratchDir dir("frugal_atomic_file_links");
  fs::create_directory(dir.path / "data");
  const fs::path link = dir.path / "model.safetensors", relative_link = dir.path / "rel.json";
  fs::create_symlink(dir.path / "data" / "model.safetensors", link);  // absolute, dangling
  fs::create_symlink(fs::path("data") / "rel.json", relative_link);   // relative, dangling
  nn::write_file_atomically(link.string(), "abc", "test");
  nn::write_file_atomically(relative_link.string(), "def", "test");
  CHECK(fs::is_symlink(link));
  CHECK(fs::is_symlink(relative_link));
  CHECK(read_file(dir.path / "data" / "model.safetensors") == "abc");
  CHECK(read_file(dir.path / "data" / "rel.json") == "def");
  const fs::path nowhere = dir.path / "nowhere.json";
  fs::create_symlink(dir.path / "missing_dir" / "x.json", nowhere);
  check_error([&] { nn::write_file_atomically(nowhere.string(), "x", "test"); },
              {"test", nowhere.string(), "whose directory does not exist"});
  CHECK(fs::is_symlink(nowhere));

  const fs::path path = dir.path / "once.json";
  nn::AtomicFileWriter writer(path.string(), "test");
  writer.write("x");
  writer.commit();
  check_error([&] { writer.commit(); }, {"test", "commit() twice", path.string(), "written already"});
  check_error([&] { writer.write("y"); }, {"test", "write after commit()", path.string()});
  CHECK(read_file(path) == "x");
  check_error([&] { nn::write_file_atomically("", "x", "test"); }, {"test", "the path is empty"});
}
