#pragma once
// Masked-language-model inputs and labels for BERT, as Hugging Face's
// DataCollatorForLanguageModeling makes them.
//
// Note [BERT masking]
// Devlin et al.'s recipe, drawn afresh for every batch (dynamic masking, as RoBERTa): each
// position whose id is not special is selected with probability select_probability (0.15);
// a selected position's label is its id, and its input becomes mask_id with probability
// mask_probability (0.8), a random token with random_probability (0.1), and stays itself
// otherwise (0.1). Labels are -100 (ignored by the loss) everywhere else. The special ids are
// never selected: HF's collator zeroes their probability through the tokenizer's
// get_special_tokens_mask(already_has_special_tokens=True), which marks every id of
// all_special_ids, for BertTokenizer [PAD] [UNK] [CLS] [SEP] [MASK] (WordPiece::special_ids()),
// so neither a frame token nor an [UNK] nor a literal "[MASK]" of the text is a target. Two
// departures, both about what a batch can contain rather than how often it is masked: a random
// replacement is drawn uniformly from the vocab's non-special ids (HF draws from the whole
// vocab, specials included), and when no position was selected one eligible position is
// picked uniformly and masked, so that every sequence with a non-special id has a target
// (HF's loss would be 0/0 on such a sequence).
//
// The draws, from a Generator (nn/data/transforms.h's draw_uniform and draw_below), in order:
// for each position, one draw_uniform if its id is not special (< select_probability:
// selected), and for a selected one a second draw_uniform r (r < mask_probability: mask_id;
// r < mask_probability + random_probability: a random token by draw_below, repeated while it
// hits a special id); then, if nothing was selected, one draw_below over the eligible positions.
#include <cstdint>
#include <span>
#include <vector>

#include "tensor/random.h"

namespace frugal::data {

/// What mask_for_mlm needs of the vocab, and the probabilities of Note [BERT masking] (HF's).
struct MlmMasking {
  int64_t vocab_size = 0;
  int64_t mask_id = -1;
  std::vector<int64_t> special_ids;  // never selected nor drawn (WordPiece::special_ids())
  double select_probability = 0.15;
  double mask_probability = 0.8;
  double random_probability = 0.1;
};

/// Masks one sequence in place (Note [BERT masking]): `ids` (T) become the model's inputs and
/// `labels` (T) receive the selected positions' original ids and -100 elsewhere. Throws
/// frugal::Error when the sizes differ, mask_id is outside [0, vocab_size) or not special,
/// the probabilities are outside [0, 1] (or mask + random exceeds 1), or every id is special.
/// Returns the number of positions selected.
int64_t mask_for_mlm(std::span<int64_t> ids, std::span<int64_t> labels, const MlmMasking& masking, Generator& gen);

}  // namespace frugal::data
