// Probes of the files frugal writes and reads (2026-12-04 findings): a save never replaces a
// FIFO (or a device: as root, saving to /dev/null once swapped it for a regular file), writes
// through a symbolic link and keeps a replaced file's permission bits (Note [Saving over what
// is there] in nn/file.h); JSON documents are capped in values, not only in bytes and depth;
// numbers are read the same in every locale; a load names the file that does not fit.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <clocale>
#include <filesystem>
#include <string>

#include "core/json.h"
#include "models/pretrained.h"
#include "nn/linear.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"
#include "tests/test_util.h"
#include "train/checkpoints.h"

using namespace frugal;
using namespace frugal::testing;
namespace fs = std::filesystem;

TEST_CASE("probe files: a save refuses a FIFO, writes through a symlink, keeps a replaced file's mode") {
  ScratchDir dir("frugal_probe_files");
  const std::string fifo = (dir.path / "pipe").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  check_error([&] { nn::save_safetensors(fifo, {{"w", ones({4})}}); }, {"save_safetensors", fifo, "is a FIFO"});
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));  // still a FIFO, not a regular file

  // A private file stays private after a save over it.
  const std::string priv = (dir.path / "private.safetensors").string();
  nn::save_safetensors(priv, {{"w", ones({2})}});
  REQUIRE(::chmod(priv.c_str(), 0600) == 0);
  nn::save_safetensors(priv, {{"w", zeros({2})}});
  REQUIRE(::stat(priv.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(nn::load_safetensors(priv).tensors.at("w").tolist<float>() == std::vector<float>{0, 0});

  // Through a link: the target gets the new file, the link stays a link.
  const std::string link = (dir.path / "latest.safetensors").string();
  fs::create_symlink(priv, link);
  nn::save_safetensors(link, {{"w", full({2}, 3.0)}});
  REQUIRE(::lstat(link.c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(nn::load_safetensors(priv).tensors.at("w").tolist<float>() == std::vector<float>{3, 3});
}

TEST_CASE("probe files: a JSON document of more values than the cap is refused before it takes gigabytes") {
  std::string text = "[0";
  for (uint64_t i = 0; i < json::kMaxValues; ++i) text += ",0";
  text += "]";
  check_error([&] { json::parse(text); }, {"JSON", "more than", "values"});
  CHECK(json::parse("[1, 2.5, -3e2]").items.size() == 3);
}

TEST_CASE("probe files: numbers are read and written the same under a comma-decimal locale") {
  CHECK(*json::parse("0.1").as_double() == 0.1);
  CHECK(*json::parse("-2.5e-3").as_double() == -2.5e-3);
  CHECK(std::isinf(*json::parse("1e999").as_double()));
  CHECK_FALSE(json::parse("\"0.1\"").as_double().has_value());
  // Where the machine has such a locale (CI may not), strtod would read 0.1 as 0 there.
  const char* locales[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"};
  const std::string before = std::setlocale(LC_NUMERIC, nullptr);
  for (const char* name : locales) {
    if (!std::setlocale(LC_NUMERIC, name)) continue;
    CHECK(*json::parse("0.1").as_double() == 0.1);
    std::setlocale(LC_NUMERIC, before.c_str());
    MESSAGE("checked under ", name);
    break;
  }
}

TEST_CASE("probe files: load_safetensors_into names the file; a checkpoint step beyond 18 digits is refused") {
  ScratchDir dir("frugal_probe_files_load");
  const std::string path = (dir.path / "weights.safetensors").string();
  nn::save_safetensors(path, {{"weight", zeros({2, 3})}});  // no bias
  nn::Linear m(3, 2);
  check_error([&] { models::load_safetensors_into(m, path); }, {"load_safetensors_into", path, "bias"});
  train::CheckpointManager ckpt((dir.path / "ckpt").string());
  nn::Linear model(2, 2);
  check_error([&] { ckpt.save(1000000000000000000, {.model = &model}); }, {"step must be in [0, 10^18)"});
}
