#pragma once
// BERT's WordPiece tokenizer, reading a Hugging Face vocab.txt: the text rules of HF's
// BertTokenizer (BasicTokenizer, then WordpieceTokenizer), so that the ids match what
// bert-base-uncased's tokenizer gives.
//
// Note [WordPiece pipeline]
// As HF's BertTokenizer (tokenization_bert.py) does, in this order:
//  1. special tokens: occurrences of the unknown token and of [CLS] [SEP] [PAD] [MASK] (those
//     in the vocab) are cut out of the text first and kept whole, as HF's added-tokens trie
//     does, so "the [MASK] sat" keeps its [MASK];
//  2. UTF-8 decoding with replacement (Note [Invalid UTF-8]);
//  3. clean-up: NUL, U+FFFD and control characters dropped, whitespace turned into ' ';
//  4. ' ' put around every CJK ideograph, so each is a word of its own;
//  5. NFC (unicodedata.normalize("NFC", text)), so that "e" U+0301 is the vocab's U+00E9 and
//     U+037E GREEK QUESTION MARK is ';' (Note [Unicode normalization]);
//  6. split on whitespace; each word lower-cased (lower_case), then accents stripped
//     (strip_accents, which unset follows lower_case: NFD, then combining marks dropped);
//  7. each punctuation character made a word of its own ("don't" -> don ' t);
//  8. WordPiece on each word: a word of more than max_input_chars_per_word code points is
//     the unknown token; otherwise the longest vocab entry that prefixes it is taken, then
//     the longest "##"-prefixed entry that prefixes the rest, and so on; if some rest has no
//     entry, the whole word is the unknown token ("greedy longest-match-first").
// Unicode is covered by tables (Note [Unicode coverage]). decode() joins tokens with ' '
// and removes " ##", without HF's clean_up_tokenization_spaces (" ." is left as it is).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace frugal::data {

/// The options of BertTokenizer that frugal supports (bert-base-uncased's values by default).
struct WordPieceOptions {
  bool lower_case = true;  ///< do_lower_case
  /// Unset follows lower_case, as HF's strip_accents=None: a cased model's tokenizer_config.json
  /// (bert-base-cased: {"do_lower_case": false}) keeps accents, an uncased one strips them.
  std::optional<bool> strip_accents{};
  std::string unk_token = "[UNK]";
  int64_t max_input_chars_per_word = 100;
};

/// A WordPiece vocabulary and BERT's text rules (Note [WordPiece pipeline]). Immutable once
/// read, so one instance may serve several threads.
class WordPiece {
 public:
  /// Reads a vocab.txt: one token per line, id = line number from 0; a line ends at '\n', "\r\n"
  /// or a lone '\r', as Python's universal newlines with which HF reads it. Throws
  /// frugal::Error naming the file when it is missing, not a regular file, empty, not UTF-8
  /// (naming the line), holds a token twice (naming both lines) or lacks `unk_token`.
  static WordPiece from_file(const std::string& vocab_path, WordPieceOptions options = {});

  /// The ids of `text`'s tokens, without [CLS]/[SEP].
  std::vector<int64_t> encode(std::string_view text) const;
  /// The tokens of `text` ("unaffable" -> "un", "##aff", "##able").
  std::vector<std::string> tokenize(std::string_view text) const;
  /// The tokens of `ids` joined by ' ', with " ##" removed. Throws on an id outside [0, size()).
  std::string decode(const std::vector<int64_t>& ids) const;
  /// [CLS] text [SEP], the text's ids cut so that the whole is at most `max_len` (>= 2) ids.
  std::vector<int64_t> encode_for_bert(std::string_view text, int64_t max_len) const;

  /// The id of `token`; throws frugal::Error naming it and the vocab file when it is absent.
  int64_t token_id(std::string_view token) const;
  /// The token of `id`; throws when `id` is outside [0, size()).
  const std::string& token(int64_t id) const;
  /// Whether `token` is in the vocab.
  bool contains(std::string_view token) const;
  /// The ids of the special tokens the vocab holds: the unknown token, then those of [CLS]
  /// [SEP] [PAD] [MASK] present; BertTokenizer's all_special_ids, which masking for MLM never
  /// selects (Note [BERT masking] in nn/data/mlm_masking.h).
  std::vector<int64_t> special_ids() const;
  int64_t size() const { return int64_t(tokens_.size()); }
  const std::string& path() const { return path_; }
  const WordPieceOptions& options() const { return options_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Index = std::unordered_map<std::string, int64_t, Hash, std::equal_to<>>;

  WordPiece() = default;
  // Steps 2-7 of the Note on one stretch of text without special tokens.
  std::vector<std::string> basic_tokenize(std::string_view text) const;
  // Step 8 on one word, appending token ids.
  void wordpiece(const std::string& word, std::vector<int64_t>& ids) const;

  std::string path_;
  WordPieceOptions options_;
  std::vector<std::string> tokens_;    // id -> token
  Index ids_;                          // token -> id
  std::vector<std::string> specials_;  // the special tokens present, cut out first (step 1)
  int64_t unk_id_ = 0;
};

}  // namespace frugal::data
