#include "nn/data/wordpiece.h"

#include "core/error.h"
#include "nn/data/unicode_text.h"
#include "nn/file.h"

namespace frugal::data {

namespace {

constexpr uint64_t kMaxVocabBytes = uint64_t(256) << 20;  // bert-base's vocab.txt is 232 KB
// The special tokens of BertTokenizer besides unk_token: kept whole when they are in the vocab.
constexpr const char* kSpecialTokens[] = {"[CLS]", "[SEP]", "[PAD]", "[MASK]"};

std::string hex_byte(uint8_t b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

}  // namespace

WordPiece WordPiece::from_file(const std::string& vocab_path, WordPieceOptions options) {
  const char* op = "WordPiece::from_file";
  FRUGAL_CHECK(options.max_input_chars_per_word > 0, op, ": max_input_chars_per_word is ",
               options.max_input_chars_per_word, ", must be positive");
  FRUGAL_CHECK(!options.unk_token.empty(), op, ": unk_token is empty");
  const std::string text = nn::ReadOnlyFile(vocab_path, op).read_all(kMaxVocabBytes);
  FRUGAL_CHECK(!text.empty(), op, ": ", vocab_path, " is empty; a vocab.txt holds one token per line");
  WordPiece wp;
  wp.path_ = vocab_path;
  wp.options_ = std::move(options);
  for (size_t pos = 0; pos < text.size();) {
    // A line ends at "\n", "\r\n" or a lone "\r": Python's universal newlines, with which HF's
    // load_vocab reads the file (open(vocab_file, "r")), so that the ids are its line numbers.
    size_t end = text.find_first_of("\r\n", pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + (text.compare(end, 2, "\r\n") == 0 ? 2 : 1);
    const int64_t id = wp.size(), line_no = id + 1;
    size_t bad = 0;
    FRUGAL_CHECK(unicode::valid_utf8(line, &bad), op, ": ", vocab_path, " line ", line_no, ": not valid UTF-8 (byte ",
                 bad + 1, " of the line is ", hex_byte(uint8_t(line[bad])), ")");
    wp.tokens_.emplace_back(line);
    if (line.empty()) continue;  // a blank line keeps its id but is no token
    const auto [it, fresh] = wp.ids_.emplace(std::string(line), id);
    FRUGAL_CHECK(fresh, op, ": ", vocab_path, " line ", line_no, ": token '", line, "' is already on line ",
                 it->second + 1, " (ids ", it->second, " and ", id, ")");
  }
  const auto unk = wp.ids_.find(wp.options_.unk_token);
  FRUGAL_CHECK(unk != wp.ids_.end(), op, ": ", vocab_path, " (", wp.size(), " lines) has no unknown token '",
               wp.options_.unk_token, "' (WordPieceOptions::unk_token)");
  wp.unk_id_ = unk->second;
  wp.specials_.push_back(wp.options_.unk_token);
  for (const char* s : kSpecialTokens)
    if (wp.contains(s) && s != wp.options_.unk_token) wp.specials_.emplace_back(s);
  return wp;
}

bool WordPiece::contains(std::string_view token) const { return ids_.find(token) != ids_.end(); }

std::vector<int64_t> WordPiece::special_ids() const {
  std::vector<int64_t> ids;
  for (const std::string& s : specials_) ids.push_back(ids_.find(s)->second);
  return ids;
}

int64_t WordPiece::token_id(std::string_view token) const {
  const auto it = ids_.find(token);
  FRUGAL_CHECK(it != ids_.end(), "WordPiece::token_id: token '", token, "' is not in the vocab ", path_, " (", size(),
               " tokens)");
  return it->second;
}

const std::string& WordPiece::token(int64_t id) const {
  FRUGAL_CHECK(id >= 0 && id < size(), "WordPiece: id ", id, " is outside the vocab ", path_, " of ", size(),
               " tokens");
  return tokens_[size_t(id)];
}

// Note [WordPiece pipeline], steps 2-7.
std::vector<std::string> WordPiece::basic_tokenize(std::string_view text) const {
  std::vector<char32_t> clean;  // steps 2-4
  for (char32_t cp : unicode::decode_utf8(text)) {
    if (cp == 0 || cp == unicode::kReplacement || unicode::is_control(cp)) continue;
    if (unicode::is_whitespace(cp)) {
      clean.push_back(' ');
    } else if (unicode::is_cjk(cp)) {
      clean.insert(clean.end(), {' ', cp, ' '});
    } else {
      clean.push_back(cp);
    }
  }
  clean = unicode::nfc(clean);  // step 5
  std::vector<std::string> words;
  std::vector<char32_t> word, lowered, stripped;
  const auto finish = [&] {  // step 6's normalisation and step 7 on one whitespace-separated word
    if (word.empty()) return;
    lowered = options_.lower_case ? unicode::lower(word) : word;
    if (options_.strip_accents.value_or(options_.lower_case)) {  // NFD, then the marks dropped
      stripped = unicode::nfd(lowered);
      std::erase_if(stripped, unicode::is_combining_mark);
    } else {
      stripped = lowered;
    }
    std::string piece;
    for (char32_t cp : stripped) {
      if (!unicode::is_punctuation(cp)) {
        unicode::append_utf8(piece, cp);
        continue;
      }
      if (!piece.empty()) words.push_back(std::move(piece)), piece.clear();
      unicode::append_utf8(piece, cp);
      words.push_back(std::move(piece)), piece.clear();
    }
    if (!piece.empty()) words.push_back(std::move(piece));
    word.clear();
  };
  for (char32_t cp : clean) {
    if (cp == ' ') finish();
    else word.push_back(cp);
  }
  finish();
  return words;
}

// Note [WordPiece pipeline], step 8.
void WordPiece::wordpiece(const std::string& word, std::vector<int64_t>& ids) const {
  std::vector<size_t> starts;  // byte offset of each code point, then the end
  for (size_t i = 0; i < word.size(); ++i)
    if ((uint8_t(word[i]) & 0xC0) != 0x80) starts.push_back(i);
  const size_t n = starts.size();
  starts.push_back(word.size());
  if (int64_t(n) > options_.max_input_chars_per_word) {
    ids.push_back(unk_id_);
    return;
  }
  const size_t first = ids.size();
  std::string piece;
  for (size_t start = 0; start < n;) {
    int64_t found = -1;
    size_t end = n;
    for (; end > start; --end) {
      piece.assign(start > 0 ? "##" : "");
      piece.append(word, starts[start], starts[end] - starts[start]);
      if (const auto it = ids_.find(piece); it != ids_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {  // no piece fits here: the whole word is unknown
      ids.resize(first);
      ids.push_back(unk_id_);
      return;
    }
    ids.push_back(found);
    start = end;
  }
}

std::vector<int64_t> WordPiece::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  // Where each special token occurs next at or after `pos`, kept between rounds so that a text
  // with many special tokens is still scanned once per token kind.
  std::vector<size_t> next;
  for (const std::string& s : specials_) next.push_back(text.find(s));
  for (size_t pos = 0; pos <= text.size();) {
    size_t at = std::string_view::npos;  // step 1: the next special token
    const std::string* special = nullptr;
    for (size_t k = 0; k < specials_.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(specials_[k], pos);
      if (next[k] < at) at = next[k], special = &specials_[k];
    }
    for (const std::string& word : basic_tokenize(text.substr(pos, at == std::string_view::npos ? at : at - pos)))
      wordpiece(word, ids);
    if (!special) break;
    ids.push_back(ids_.find(*special)->second);
    pos = at + special->size();
  }
  return ids;
}

std::vector<std::string> WordPiece::tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  for (int64_t id : encode(text)) tokens.push_back(tokens_[size_t(id)]);
  return tokens;
}

std::string WordPiece::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    const std::string& t = token(id);
    if (t.rfind("##", 0) == 0 && !out.empty()) out.append(t, 2);  // " ##" removed
    else out += (out.empty() ? "" : " ") + t;
  }
  return out;
}

std::vector<int64_t> WordPiece::encode_for_bert(std::string_view text, int64_t max_len) const {
  FRUGAL_CHECK(max_len >= 2, "WordPiece::encode_for_bert: max_len ", max_len,
               " leaves no room for [CLS] and [SEP]; it must be at least 2");
  const int64_t cls = token_id("[CLS]"), sep = token_id("[SEP]");
  std::vector<int64_t> ids = encode(text);
  if (int64_t(ids.size()) > max_len - 2) ids.resize(size_t(max_len - 2));
  ids.insert(ids.begin(), cls);
  ids.push_back(sep);
  return ids;
}

}  // namespace frugal::data
