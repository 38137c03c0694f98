// safetensors I/O: round trips of every dtype and layout, a byte-exact golden file
// written by hand from the published format, every malformed input the reader must
// reject (with the message it must give), crash-safe saving, metadata; and the JSON
// parser underneath.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/json.h"
#include "nn/safetensors.h"
#include "tensor/factory.h"
#include "tests/dead_pid.h"
#include "tests/fifo_guard.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using frugal::nn::SafetensorsFile;

namespace {

namespace fs = std::filesystem;

// A fresh directory under /tmp, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "frugal_safetensors_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Names of the entries in the directory, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A safetensors file from its parts: the 8-byte little-endian length of `header`, `header`
// (taken as is: no padding added), then `data`.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(uint64_t(header.size()) >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Little-endian bytes of one value.
template <typename T>
std::vector<uint8_t> le_bytes(T v) {
  std::vector<uint8_t> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

void append(std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { a.insert(a.end(), b.begin(), b.end()); }

SafetensorsFile parse(const std::vector<uint8_t>& bytes) { return nn::parse_safetensors(bytes.data(), bytes.size()); }

// Expects parse_safetensors on `header` + `data` to throw an error containing every part,
// and load_safetensors of the same bytes as a file to name the file as well.
void expect_rejected(const std::string& header, const std::vector<uint8_t>& data, std::vector<std::string> parts) {
  const std::vector<uint8_t> bytes = make_file(header, data);
  check_error([&] { parse(bytes); }, parts);
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  parts.push_back(path);
  check_error([&] { nn::load_safetensors(path); }, parts);
}

void check_same_tensor(const Tensor& actual, const Tensor& expected, const std::string& what) {
  INFO(what);
  REQUIRE(actual.defined());
  CHECK(actual.dtype() == expected.dtype());
  CHECK(actual.sizes() == expected.sizes());
  CHECK(actual.device() == kCPU);
  CHECK(values_of(actual) == values_of(expected));  // exact: bytes are copied, never converted
}

constexpr DType kAllTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kBool};

}  // namespace

// ---- round trips ----------------------------------------------------------------------

TEST_CASE("safetensors: round trip of every dtype, layout, 0-d and empty tensors") {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t seed = 1;
  // Values in [-100, 100) (truncated for integers), or 0/1 for bool.
  auto sample = [&](const Shape& shape, DType t, Layout layout) {
    std::vector<double> v = random_values(numel_of(shape), seed++, -100.0, 100.0);
    if (t == kBool)
      for (double& x : v) x = x > 0 ? 1.0 : 0.0;
    return make_tensor(v, shape, {t, kCPU}, layout);
  };
  for (DType t : kAllTypes) {
    const std::string name = dtype_name(t);
    for (Layout layout : kAllLayouts) tensors.emplace_back(name + "." + layout_name(layout), sample({3, 5}, t, layout));
    tensors.emplace_back(name + ".scalar", sample({}, t, Layout::Contiguous));
    tensors.emplace_back(name + ".empty", empty({0, 3}, {t, kCPU}));
    tensors.emplace_back(name + ".3d", sample({2, 3, 4}, t, Layout::Transposed));
  }
  CHECK_FALSE(tensors[1].second.is_contiguous());  // the layouts really are views

  const std::string path = dir.file("all.safetensors");
  nn::save_safetensors(path, tensors);
  const SafetensorsFile loaded = nn::load_safetensors(path);
  CHECK(loaded.tensors.size() == tensors.size());
  CHECK(loaded.metadata.empty());
  for (const auto& [name, t] : tensors) {
    const auto it = loaded.tensors.find(name);
    REQUIRE_MESSAGE(it != loaded.tensors.end(), name);
    check_same_tensor(it->second, t, name);
    CHECK(it->second.is_contiguous());
  }
  // The file is exactly 8 + header + the tensors' bytes: no gaps.
  size_t data_bytes = 0;
  for (const auto& [name, t] : tensors) data_bytes += size_t(t.numel()) * t.element_size();
  const std::vector<uint8_t> bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[size_t(i)];
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + data_bytes);
  CHECK(dir.listing() == std::vector<std::string>{"all.safetensors"});  // no temporary left
}

TEST_CASE("safetensors: an empty dict and a dict of only empty tensors") {
  TempDir dir;
  const std::string path = dir.file("empty.safetensors");
  nn::save_safetensors(path, {});
  // The Python library writes "{}" padded to 8 bytes and no data.
  const std::vector<uint8_t> expected = make_file("{}      ", {});
  CHECK(read_bytes(path) == expected);
  CHECK(nn::load_safetensors(path).tensors.empty());

  nn::save_safetensors(path, {{"e", empty({0}, {kFloat32, kCPU})}, {"f", empty({4, 0, 2}, {kInt64, kCPU})}});
  const SafetensorsFile f = nn::load_safetensors(path);
  REQUIRE(f.tensors.size() == 2);
  CHECK(f.tensors.at("e").sizes() == Shape{0});
  CHECK(f.tensors.at("f").sizes() == Shape{4, 0, 2});
  CHECK(f.tensors.at("f").dtype() == kInt64);
}

TEST_CASE("safetensors: metadata and names round trip, escaped as serde_json escapes") {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"quote\"back\\slash", "tab\tnewline\ncontrol\x01"},
                                                       {"utf8", "h\xc3\xa9llo \xe2\x82\xac"},
                                                       {"", ""}};
  const Tensor w = random_tensor({2, 2}, {kFloat32, kCPU}, 7);
  const std::string odd_name = "layer.0/w \"x\"\n";
  nn::save_safetensors(path, {{odd_name, w}}, metadata);

  const SafetensorsFile f = nn::load_safetensors(path);
  CHECK(f.metadata == metadata);
  REQUIRE(f.tensors.count(odd_name) == 1);
  check_same_tensor(f.tensors.at(odd_name), w, "odd name");

  const std::vector<uint8_t> bytes = read_bytes(path);
  const std::string text(bytes.begin() + 8, bytes.end());
  CHECK(text.find(R"("quote\"back\\slash":"tab\tnewline\ncontrol\u0001")") != std::string::npos);
  CHECK(text.find("\"utf8\":\"h\xc3\xa9llo \xe2\x82\xac\"") != std::string::npos);  // UTF-8 verbatim
  CHECK(text.find(R"("layer.0/w \"x\"\n":{)") != std::string::npos);                // '/' not escaped
  CHECK(text.rfind("{\"__metadata__\":{\"\":\"\",\"format\":\"pt\",", 0) == 0);     // metadata first, keys sorted
}

// ---- the golden files -------------------------------------------------------------------

TEST_CASE("safetensors: byte-exact golden files built from the published format") {
  TempDir dir;
  const std::string path = dir.file("golden.safetensors");

  SUBCASE("one f32 tensor: the header needs no padding") {
    // {"attn.0": float32 (1, 2, 3) = 0..5}: the header is exactly 64 bytes.
    const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
    REQUIRE(header.size() == 64);
    std::vector<uint8_t> data;
    for (float v : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) append(data, le_bytes(v));
    const std::vector<uint8_t> expected = make_file(header, data);
    REQUIRE(expected.size() == 8 + 64 + 24);
    CHECK(expected[0] == 64);

    nn::save_safetensors(path, {{"attn.0", from_vector<float>({0, 1, 2, 3, 4, 5}, {1, 2, 3})}});
    CHECK(read_bytes(path) == expected);
    const SafetensorsFile f = parse(expected);
    CHECK(f.tensors.at("attn.0").tolist<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  }

  SUBCASE("mixed dtypes: widest dtype first, then by name; metadata first; space padding") {
    // The Rust writer sorts by its Dtype enum descending (I64 > F64 > F32 > I32 > BF16 >
    // F16 > BOOL), then by name, and lays the data out in that order.
    const std::string header = R"({"__metadata__":{"format":"pt"},)"
                               R"("a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                               R"("d":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
                               R"("zz":{"dtype":"F32","shape":[1],"data_offsets":[24,28]},)"
                               R"("i":{"dtype":"I32","shape":[1,1],"data_offsets":[28,32]},)"
                               R"("e":{"dtype":"BF16","shape":[0],"data_offsets":[32,32]},)"
                               R"("c":{"dtype":"F16","shape":[],"data_offsets":[32,34]},)"
                               R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[34,37]}})";
    REQUIRE(header.size() == 473);
    const std::string padded = header + std::string(7, ' ');  // to 480, a multiple of 8
    std::vector<uint8_t> data;
    append(data, le_bytes<int64_t>(-7));
    append(data, le_bytes<double>(0.1));
    append(data, le_bytes<float>(1.5f));
    append(data, le_bytes<float>(-2.0f));
    append(data, le_bytes<float>(0.5f));
    append(data, le_bytes<int32_t>(123456));
    append(data, {0x00, 0x3C});  // f16 1.0
    append(data, {1, 0, 1});
    const std::vector<uint8_t> expected = make_file(padded, data);

    // Given in an order unlike the file's.
    nn::save_safetensors(path,
                         {{"m", from_vector<bool>({true, false, true}, {3})},
                          {"c", full({}, 1.0, {kFloat16, kCPU})},
                          {"zz", from_vector<float>({0.5f}, {1})},
                          {"e", empty({0}, {kBFloat16, kCPU})},
                          {"b", from_vector<float>({1.5f, -2.0f}, {2})},
                          {"i", from_vector<int32_t>({123456}, {1, 1})},
                          {"d", from_vector<double>({0.1}, {1})},
                          {"a", from_vector<int64_t>({-7}, {1})}},
                         {{"format", "pt"}});
    CHECK(read_bytes(path) == expected);

    const SafetensorsFile f = parse(expected);
    CHECK(f.metadata == std::map<std::string, std::string>{{"format", "pt"}});
    CHECK(f.tensors.at("a").tolist<int64_t>() == std::vector<int64_t>{-7});
    CHECK(f.tensors.at("d").tolist<double>() == std::vector<double>{0.1});
    CHECK(f.tensors.at("b").tolist<float>() == std::vector<float>{1.5f, -2.0f});
    CHECK(f.tensors.at("i").sizes() == Shape{1, 1});
    CHECK(f.tensors.at("c").dim() == 0);
    CHECK(f.tensors.at("c").item<float>() == 1.0f);
    CHECK(f.tensors.at("e").numel() == 0);
    CHECK(f.tensors.at("m").dtype() == kBool);
    CHECK(f.tensors.at("m").tolist<bool>() == std::vector<bool>{true, false, true});
  }
}

TEST_CASE("safetensors: files in any tensor order and with header whitespace load") {
  // Older writers ordered by name only; JSON whitespace (and padding) is allowed.
  const std::string header =
      " {\n \"b\" : {\"shape\": [1], \"dtype\": \"I32\", \"data_offsets\": [4, 8]},"
      " \"a\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4]}}  ";
  std::vector<uint8_t> data;
  append(data, le_bytes<int32_t>(1));
  append(data, le_bytes<int32_t>(2));
  const SafetensorsFile f = parse(make_file(header, data));
  CHECK(f.tensors.at("a").item<int32_t>() == 1);
  CHECK(f.tensors.at("b").item<int32_t>() == 2);
}

// A U8 tensor (an image dataset, quantized codes: Note [Storage-only uint8]) loads as kUInt8
// with its bytes, reads as numbers through a cast, and saves back byte for byte.
TEST_CASE("safetensors: U8 tensors load as uint8, cast to numbers, and round trip") {
  TempDir dir;
  const std::string header = R"({"img":{"dtype":"U8","shape":[2,3],"data_offsets":[0,6]}})";
  const std::vector<uint8_t> data = {0, 1, 127, 128, 200, 255};
  const std::vector<uint8_t> file = make_file(header, data);
  const SafetensorsFile f = parse(file);
  const Tensor img = f.tensors.at("img");
  CHECK(img.dtype() == kUInt8);
  CHECK(img.sizes() == Shape{2, 3});
  CHECK(img.to(kFloat32).tolist<float>() == std::vector<float>{0, 1, 127, 128, 200, 255});
  const std::string path = dir.file("u8.safetensors");
  nn::save_safetensors(path, {{"img", img}});
  CHECK(read_bytes(path) == make_file(header + "       ", data));  // padded with spaces to 64 bytes, as the writer pads
}

TEST_CASE("safetensors: BOOL bytes other than 0 and 1 load as true") {
  const SafetensorsFile f = parse(make_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", {0, 2, 255}));
  CHECK(f.tensors.at("m").tolist<bool>() == std::vector<bool>{false, true, true});
  CHECK(values_of(f.tensors.at("m")) == std::vector<double>{0, 1, 1});
}

// ---- malformed input ------------------------------------------------------------------

TEST_CASE("safetensors: the reader rejects malformed files with clear messages") {
  const std::vector<uint8_t> d24(24, 0);
  const std::string ok = R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";

  SUBCASE("too short for the length field") {
    for (size_t n : {0, 1, 7}) {
      const std::vector<uint8_t> bytes(n, 0);
      check_error([&] { nn::parse_safetensors(bytes.data(), bytes.size()); },
                  {"file is " + std::to_string(n) + " bytes", "too short for the 8-byte header length"});
    }
    check_error([] { nn::parse_safetensors(nullptr, 0); }, {"too short"});
    TempDir dir;
    write_bytes(dir.file("short"), {1, 2, 3});
    check_error([&] { nn::load_safetensors(dir.file("short")); }, {dir.file("short"), "file is 3 bytes"});
  }
  SUBCASE("header length over the limit or past the end of the file") {
    for (uint64_t n : {uint64_t(100'000'001), ~uint64_t(0)}) {
      std::vector<uint8_t> bytes = le_bytes(n);
      append(bytes, std::vector<uint8_t>(16, ' '));
      check_error([&] { parse(bytes); }, {"header length " + std::to_string(n), "exceeds the limit of 100000000"});
    }
    std::vector<uint8_t> bytes = le_bytes<uint64_t>(100);
    append(bytes, std::vector<uint8_t>(20, ' '));
    check_error([&] { parse(bytes); },
                {"header length 100", "exceeds the 20 bytes that follow it", "file is 28 bytes"});
  }
  SUBCASE("header is not valid JSON") {
    // The byte counts from the start of the file: the header starts at byte 8.
    expect_rejected(R"({"w":})", {}, {"header is not valid JSON: JSON: unexpected '}' at byte 13 (line 1, column 6)"});
    expect_rejected("{\n\"w\": 1,\n x}", {}, {"expected a string key at byte 19 (line 3, column 2)"});
    expect_rejected("", {}, {"header is not valid JSON", "text ended"});
    expect_rejected(R"({"w":)", {}, {"header is not valid JSON", "ended"});
    expect_rejected(R"({"w":{}} x)", {}, {"header is not valid JSON", "after the value"});
    expect_rejected(R"({"w":{},})", {}, {"header is not valid JSON", "expected a string key"});
    expect_rejected("{\"w\xff\":{}}", {}, {"header is not valid JSON", "UTF-8"});
    expect_rejected("{\"w\xc0\xaf\":{}}", {}, {"header is not valid JSON", "UTF-8"});  // overlong '/'
    expect_rejected("{\"w\n\":{}}", {}, {"header is not valid JSON", "control character"});
    expect_rejected(R"({"w":01})", {}, {"header is not valid JSON", "leading zero"});
    expect_rejected(R"({"w":"\ud800"})", {}, {"header is not valid JSON", "surrogate"});
    expect_rejected(R"({"w":nul})", {}, {"header is not valid JSON"});
    expect_rejected(std::string(100, '[') + std::string(100, ']'), {}, {"header is not valid JSON", "nested deeper"});
  }
  SUBCASE("header is not an object, or its values have the wrong types") {
    expect_rejected("[1,2]", {}, {"header is an array, expected a JSON object"});
    expect_rejected(R"("x")", {}, {"expected a JSON object"});
    expect_rejected(R"({"w":3})", {}, {"tensor \"w\"", "entry is the number 3, expected an object"});
    expect_rejected(R"({"w":{"dtype":1,"shape":[],"data_offsets":[0,4]}})", {0, 0, 0, 0},
                    {"tensor \"w\"", "dtype is the number 1, expected a string"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,4]}})", {0, 0, 0, 0},
                    {"tensor \"w\"", "shape is a string, expected an array"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,4],"extra":1}})", {0, 0, 0, 0},
                    {"tensor \"w\"", "unknown field \"extra\""});
    expect_rejected(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", {0, 0, 0, 0},
                    {"tensor \"w\"", "missing field \"shape\""});
    expect_rejected(R"({"__metadata__":[],)" + ok + "}", d24, {"\"__metadata__\" is an array, expected an object"});
    expect_rejected(R"({"__metadata__":{"k":1},)" + ok + "}", d24,
                    {"\"__metadata__\" value for key \"k\" is the number 1, expected a string"});
  }
  SUBCASE("duplicate keys") {
    expect_rejected("{" + ok + "," + ok + "}", d24, {"header is not valid JSON", "duplicate key \"w\""});
    expect_rejected(R"({"w":{"dtype":"F32","dtype":"F32","shape":[],"data_offsets":[0,4]}})", {0, 0, 0, 0},
                    {"duplicate key \"dtype\""});
  }
  SUBCASE("unknown and unsupported dtypes") {
    expect_rejected(R"({"w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", {0, 0, 0, 0},
                    {"tensor \"w\"", "unknown dtype \"F31\""});
    for (const char* dt : {"I8", "F8_E4M3", "F8_E5M2", "U64", "I16"})
      expect_rejected(std::string(R"({"q":{"dtype":")") + dt + R"(","shape":[1],"data_offsets":[0,1]}})", {0},
                      {"tensor \"q\"", std::string("unsupported dtype ") + dt});
  }
  SUBCASE("bad shapes") {
    expect_rejected(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]}})", {},
                    {"tensor \"w\"", "shape[1] is the number -1, expected a non-negative integer"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", std::vector<uint8_t>(8),
                    {"tensor \"w\"", "shape[0] is the number 2.0"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", std::vector<uint8_t>(8),
                    {"tensor \"w\"", "shape[0] is a string"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})",
                    std::vector<uint8_t>(8), {"tensor \"w\"", "shape[0] is the number 18446744073709551616"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})",
                    std::vector<uint8_t>(8), {"tensor \"w\"", "expected a non-negative integer"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", {},
                    {"tensor \"w\"", "shape [4294967296,4294967296] of F32 overflows"});
    expect_rejected(R"({"w":{"dtype":"I64","shape":[2305843009213693952],"data_offsets":[0,0]}})", {},
                    {"tensor \"w\"", "overflows"});
    // A zero dimension makes the tensor empty, but the other sizes must still multiply
    // within int64 (its strides need that): [2^62, 2^62, 0] once passed as 0 bytes and
    // then overflowed in numel_of and contiguous_strides.
    const SafetensorsFile f =
        parse(make_file(R"({"w":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]}})", {}));
    CHECK(f.tensors.at("w").numel() == 0);
    CHECK(f.tensors.at("w").strides() == Shape{9223372036854775807, 1});
    expect_rejected(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]}})",
                    {}, {"tensor \"w\"", "shape [4611686018427387904,4611686018427387904,0] of F32 overflows"});
    expect_rejected(R"({"w":{"dtype":"BOOL","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", {},
                    {"tensor \"w\"", "overflows"});
  }
  SUBCASE("bad data_offsets") {
    for (const char* offsets : {"[0]", "[0,4,8]", "[0,\"4\"]", "[-1,3]", "[0,4.0]", "{}", "[0,18446744073709551616]"})
      expect_rejected(std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":)") + offsets + "}}", {0, 0, 0, 0},
                      {"tensor \"w\"", "data_offsets must be an array of two non-negative integers"});
    expect_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", {0, 0, 0, 0},
                    {"tensor \"w\"", "data_offsets [4, 0] are not ordered"});
  }
  SUBCASE("byte count differs from numel * element size") {
    expect_rejected(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})", std::vector<uint8_t>(12),
                    {"tensor \"w\"", "data_offsets [0, 12] hold 12 bytes but F32 [2,3] needs 24"});
    expect_rejected(R"({"w":{"dtype":"F16","shape":[],"data_offsets":[0,4]}})", std::vector<uint8_t>(4),
                    {"tensor \"w\"", "hold 4 bytes but F16 [] needs 2"});
  }
  SUBCASE("offsets out of bounds: the file is shorter than the header says") {
    expect_rejected("{" + ok + "}", std::vector<uint8_t>(16),
                    {"tensor \"w\"", "data_offsets [0, 24] run past the end of the data (16 bytes"});
    expect_rejected(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[18446744073709551608,18446744073709551615]}})",
                    {}, {"tensor \"w\"", "hold 7 bytes but I64 [1] needs 8"});
    expect_rejected(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[18446744073709551607,18446744073709551615]}})",
                    {}, {"tensor \"w\"", "run past the end of the data (0 bytes"});
  }
  SUBCASE("overlapping tensors") {
    expect_rejected(R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})",
                    std::vector<uint8_t>(12), {"tensor \"b\"", "data_offsets [4, 12] overlap tensor \"a\" [0, 8]"});
    expect_rejected(R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                    std::vector<uint8_t>(8), {"overlap tensor \"a\" [0, 8]"});
    expect_rejected(R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                    R"("e":{"dtype":"I32","shape":[0],"data_offsets":[4,4]}})",
                    std::vector<uint8_t>(8), {"tensor \"e\"", "overlap tensor \"a\""});
  }
  SUBCASE("holes between tensors, before the first, or unused bytes at the end") {
    expect_rejected(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})",
                    std::vector<uint8_t>(12),
                    {"tensor \"b\"", "hole of 4 bytes between tensor \"a\" (ends at 4) and this tensor (begins at 8)"});
    expect_rejected(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})", std::vector<uint8_t>(8),
                    {"tensor \"a\"", "hole of 4 bytes before it"});
    expect_rejected(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", std::vector<uint8_t>(6),
                    {"the tensors cover 4 bytes of data but the file holds 6", "2 unused bytes at the end"});
    expect_rejected("{}", {1}, {"cover 0 bytes of data but the file holds 1"});
  }
}

TEST_CASE("safetensors: load and save errors name the file") {
  TempDir dir;
  check_error([&] { nn::load_safetensors(dir.file("missing.safetensors")); },
              {"load_safetensors: cannot open", dir.file("missing.safetensors"), "No such file"});
  check_error([&] { nn::load_safetensors(dir.path.string()); }, {dir.path.string(), "not a regular file"});
  const Tensor w = ones({2}, {kFloat32, kCPU});
  check_error(
      [&] {
        nn::save_safetensors(dir.file("no/such/dir.safetensors"), {{"w", w}});
      },
      {"save_safetensors: cannot create", dir.file("no/such/dir.safetensors.tmp."), "No such file"});
  check_error(
      [&] {
        nn::save_safetensors(dir.file("x"), {{"w", w}, {"w", w}});
      },
      {"save_safetensors", dir.file("x"), "tensor \"w\" appears twice"});
  check_error([&] { nn::save_safetensors(dir.file("x"), {{"__metadata__", w}}); }, {"\"__metadata__\" is reserved"});
  CHECK(dir.listing().empty());
}

TEST_CASE("safetensors: each reader error is located at its own check, not at a shared helper") {
  // Every error once ended in the same "[safetensors.cpp:83]", the line of the helper
  // that threw; now the location names the check that failed.
  const std::vector<std::string> headers = {
      R"({"w":3})",                                                                     // entry type
      R"({"w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})",                      // unknown dtype
      R"({"w":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})",                       // unsupported dtype
      R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",                     // shape entry
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})",                      // offsets order
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",                      // byte count
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",  // overflow
  };
  std::set<std::string> locations;
  for (const std::string& header : headers) {
    const std::vector<uint8_t> bytes = make_file(header, {0, 0, 0, 0});
    try {
      parse(bytes);
      FAIL("accepted " << header);
    } catch (const Error& e) {
      const std::string location(e.location());
      CAPTURE(e.what());
      CHECK(location.rfind("safetensors.cpp:", 0) == 0);
      locations.insert(location);
    }
  }
  CHECK(locations.size() == headers.size());
  try {
    parse(make_file("{", {}));
  } catch (const Error& e) {
    CHECK(std::string(e.location()).rfind("json.cpp:", 0) == 0);  // the parser's check, kept through the context
    CHECK(std::string(e.message()).find("safetensors: <memory buffer>: header is not valid JSON: JSON: ") == 0);
  }
}

TEST_CASE("safetensors: a FIFO, a directory or a device is refused without blocking") {
  TempDir dir;
  const std::string fifo = dir.file("weights.safetensors");
  // open() on a FIFO blocked until a writer came: run_model --weights FIFO hung.
  CHECK(returns_without_blocking_on_fifo(fifo, [&] {
    check_error([&] { nn::load_safetensors(fifo); }, {"load_safetensors", fifo, "not a regular file (a FIFO)"});
  }));
  check_error([&] { nn::load_safetensors(dir.path.string()); }, {"not a regular file (a directory)"});
  check_error([] { nn::load_safetensors("/dev/null"); }, {"/dev/null", "not a regular file (a character device)"});
}

// ---- crash-safe saving ------------------------------------------------------------------

TEST_CASE("safetensors: a failed save leaves the previous file intact and no temporary") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const Tensor v1 = random_tensor({4, 4}, {kFloat32, kCPU}, 11);
  nn::save_safetensors(path, {{"w", v1}}, {{"step", "1"}});
  const std::vector<uint8_t> before = read_bytes(path);
  const Tensor big = zeros({1 << 18}, {kFloat32, kCPU});  // 1 MiB

  SUBCASE("a tensor that throws while being written (undefined)") {
    check_error(
        [&] {
          nn::save_safetensors(path, {{"w", big}, {"broken", Tensor()}});
        },
        {path, "tensor \"broken\" is undefined"});
  }
  SUBCASE("a write that fails half-way (file size limit: EFBIG)") {
    struct rlimit old {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*old_handler)(int) = ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of the signal
    struct rlimit small = old;
    small.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string msg;
    try {
      nn::save_safetensors(path, {{"w", big}});
    } catch (const Error& e) { msg = e.what(); }
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    CHECK(msg.find("save_safetensors: cannot write") != std::string::npos);
    CHECK(msg.find(path + ".tmp.") != std::string::npos);
    CHECK(msg.find("File too large") != std::string::npos);
  }
  SUBCASE("the target is a directory: refused before anything is written (Note [Saving over what is there])") {
    const std::string target = dir.file("occupied");
    fs::create_directory(target);
    write_bytes(dir.file("occupied/inside"), {1});
    check_error(
        [&] {
          nn::save_safetensors(target, {{"w", big}});
        },
        {"save_safetensors: ", target, "is a directory", "never replaces it"});
    fs::remove_all(target);
  }
  CHECK(read_bytes(path) == before);
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors"});
  const SafetensorsFile f = nn::load_safetensors(path);
  check_same_tensor(f.tensors.at("w"), v1, "previous checkpoint");
  CHECK(f.metadata.at("step") == "1");

  // And a successful save replaces it.
  nn::save_safetensors(path, {{"w", big}}, {{"step", "2"}});
  CHECK(nn::load_safetensors(path).metadata.at("step") == "2");
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors"});
}

namespace {

// The names in `dir` that look like a save's temporary of `file` ("file.tmp.*").
std::vector<std::string> temporaries(const TempDir& dir, const std::string& file) {
  std::vector<std::string> out;
  for (const std::string& name : dir.listing())
    if (name.rfind(file + ".tmp.", 0) == 0) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("safetensors: concurrent saves of one path all succeed and leave a whole file") {
  // Two threads once shared the temporary path.tmp.<pid>: 199 of 200 rounds failed a rename.
  TempDir dir;
  const std::string path = dir.file("shared.safetensors");
  const Tensor a = random_tensor({64, 33}, {kFloat32, kCPU}, 1), b = random_tensor({7, 5}, {kFloat64, kCPU}, 2);
  constexpr int kRounds = 100;
  std::atomic<int> failures{0};
  std::string first_failure;
  std::mutex mu;
  auto saver = [&](const Tensor& t, const std::string& tag) {
    for (int round = 0; round < kRounds; ++round) {
      try {
        nn::save_safetensors(path, {{"t", t}}, {{"by", tag}});
      } catch (const Error& e) {
        std::lock_guard lock(mu);
        if (failures++ == 0) first_failure = e.what();
      }
    }
  };
  nn::save_safetensors(path, {{"t", a}}, {{"by", "a"}});
  std::thread ta(saver, a, "a"), tb(saver, b, "b");
  // Meanwhile the file is always complete: one writer's or the other's, never a mix.
  int reads = 0;
  while (reads < 50) {
    const SafetensorsFile f = nn::load_safetensors(path);
    ++reads;
    const std::string by = f.metadata.at("by");
    REQUIRE((by == "a" || by == "b"));
    check_same_tensor(f.tensors.at("t"), by == "a" ? a : b, "saved by " + by);
  }
  ta.join();
  tb.join();
  CHECK_MESSAGE(failures == 0, first_failure);
  const SafetensorsFile last = nn::load_safetensors(path);
  check_same_tensor(last.tensors.at("t"), last.metadata.at("by") == "a" ? a : b, "last save");
  CHECK(temporaries(dir, "shared.safetensors").empty());
}

TEST_CASE("safetensors: a save removes the temporaries of killed saves, and nothing else") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const pid_t gone = dead_pid();
  const std::string stale = "model.safetensors.tmp." + std::to_string(gone) + ".0123456789abcdef";
  const std::string live = "model.safetensors.tmp." + std::to_string(::getpid()) + ".0123456789abcdef";
  const std::string locked = "model.safetensors.tmp." + std::to_string(gone) + ".fedcba9876543210";
  const std::string fifo = "model.safetensors.tmp." + std::to_string(gone) + ".aaaaaaaaaaaaaaaa";
  const std::string other = "other.safetensors.tmp." + std::to_string(gone) + ".0123456789abcdef";
  const std::string odd = "model.safetensors.tmp." + std::to_string(gone) + ".notes";
  for (const std::string& name : {stale, live, locked, other, odd}) write_bytes(dir.file(name), {1, 2, 3});
  REQUIRE(::mkfifo(dir.file(fifo).c_str(), 0600) == 0);
  // A writer in another pid namespace has a pid that looks gone from here, but holds its lock.
  const int held = ::open(dir.file(locked).c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);

  nn::save_safetensors(path, {{"w", ones({2})}});
  ::close(held);
  const std::vector<std::string> left = dir.listing();
  CHECK(std::count(left.begin(), left.end(), stale) == 0);  // the one leftover of a dead writer
  for (const std::string& kept : {live, locked, fifo, other, odd}) {
    CAPTURE(kept);
    CHECK(std::count(left.begin(), left.end(), kept) == 1);
  }
  CHECK(values_of(nn::load_safetensors(path).tensors.at("w")) == std::vector<double>{1, 1});
}

TEST_CASE("safetensors: a save killed half-way leaves a whole file, and the next save cleans up") {
  // 25 random kills once left 14 path.tmp.<pid> files behind for good.
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const Tensor v1 = random_tensor({8}, {kFloat32, kCPU}, 5);
  nn::save_safetensors(path, {{"w", v1}}, {{"step", "1"}});
  const Tensor big = full({1 << 22}, 3.0, {kFloat32, kCPU});  // 16 MiB per save: a kill lands mid-save
  int kills_mid_save = 0;
  for (int attempt = 0; attempt < 40 && kills_mid_save < 3; ++attempt) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // saves until killed
      try {
        for (;;) nn::save_safetensors(path, {{"w", big}}, {{"step", "2"}});
      } catch (...) {}
      ::_exit(1);
    }
    auto child_temporary = [&] {  // model.safetensors.tmp.<child>.<random>
      for (const std::string& name : temporaries(dir, "model.safetensors"))
        if (name.find(".tmp." + std::to_string(child) + ".") != std::string::npos) return true;
      return false;
    };
    int status = 0;
    bool exited = false;
    while (!child_temporary() && !exited) {
      exited = ::waitpid(child, &status, WNOHANG) == child;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    REQUIRE_FALSE(exited);
    ::kill(child, SIGKILL);
    REQUIRE(::waitpid(child, &status, 0) == child);
    kills_mid_save += child_temporary();
    // Whatever the child got to, the file is whole: the first version or one full save.
    const SafetensorsFile f = nn::load_safetensors(path);
    check_same_tensor(f.tensors.at("w"), f.metadata.at("step") == "1" ? v1 : big, "after a kill");
  }
  REQUIRE(kills_mid_save > 0);
  nn::save_safetensors(path, {{"w", v1}}, {{"step", "3"}});  // removes the dead children's temporaries
  CHECK(temporaries(dir, "model.safetensors").empty());
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors"});
  CHECK(nn::load_safetensors(path).metadata.at("step") == "3");
}

// ---- the JSON parser ------------------------------------------------------------------------

TEST_CASE("json: strict parsing, escapes, integers") {
  const json::Value v =
      json::parse(R"( {"a": [1, -2.5e3, true, false, null], "s": "x\u00e9\ud83d\ude00\n\/\"", "o": {}} )");
  REQUIRE(v.is_object());
  REQUIRE(v.members.size() == 3);
  CHECK(v.members[0].key == "a");  // document order
  const json::Value* a = v.find("a");
  REQUIRE(a);
  REQUIRE(a->items.size() == 5);
  CHECK(a->items[0].as_uint64() == uint64_t(1));
  CHECK(a->items[1].text == "-2.5e3");
  CHECK_FALSE(a->items[1].as_uint64());
  CHECK(a->items[2].boolean);
  CHECK(a->items[4].type == json::Value::Type::Null);
  CHECK(v.find("s")->text == "x\xc3\xa9\xf0\x9f\x98\x80\n/\"");
  CHECK(v.find("o")->is_object());
  CHECK(v.find("missing") == nullptr);

  CHECK(json::parse("18446744073709551615").as_uint64() == ~uint64_t(0));
  CHECK_FALSE(json::parse("18446744073709551616").as_uint64());
  CHECK_FALSE(json::parse("-0").as_uint64());

  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", ".5", "1e", "+1", "tru", "\"\\x\"", "\"\\u12\"",
                          "\"\\udc00\"", "'a'", "{\"a\":1}}", "NaN", "[1 2]", "\"a", "\"\t\""})
    check_error([&] { json::parse(bad); }, {"JSON: "});
  check_error([] { json::parse("[[[1]]]", 2); }, {"nested deeper than 2 levels"});
  CHECK(json::parse("[[1]]", 2).items[0].items[0].as_uint64() == uint64_t(1));

  CHECK(json::quote("a\"b\\c\x01\x1f\b\f\n\r\t/\x7f\xc3\xa9") ==
        "\"a\\\"b\\\\c\\u0001\\u001f\\b\\f\\n\\r\\t/\x7f\xc3\xa9\"");
}
