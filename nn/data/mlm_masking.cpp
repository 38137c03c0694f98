#include "nn/data/mlm_masking.h"

#include <algorithm>

#include "core/error.h"
#include "nn/data/transforms.h"

namespace frugal::data {

// Note [BERT masking]; the draws in the order the Note lists them.
int64_t mask_for_mlm(std::span<int64_t> ids, std::span<int64_t> labels, const MlmMasking& m, Generator& gen) {
  const char* op = "mask_for_mlm";
  FRUGAL_CHECK(ids.size() == labels.size(), op, ": ids has ", ids.size(), " positions but labels has ", labels.size());
  FRUGAL_CHECK(m.mask_id >= 0 && m.mask_id < m.vocab_size, op, ": mask_id ", m.mask_id, " is outside the vocab of ",
               m.vocab_size, " ids");
  const auto special = [&](int64_t id) {
    return std::find(m.special_ids.begin(), m.special_ids.end(), id) != m.special_ids.end();
  };
  FRUGAL_CHECK(special(m.mask_id), op, ": mask_id ", m.mask_id, " is not among special_ids");
  const auto probability = [&](double p, const char* name) {
    FRUGAL_CHECK(p >= 0.0 && p <= 1.0, op, ": ", name, " is ", p, ", must be in [0, 1]");
  };
  probability(m.select_probability, "select_probability");
  probability(m.mask_probability, "mask_probability");
  probability(m.random_probability, "random_probability");
  FRUGAL_CHECK(m.mask_probability + m.random_probability <= 1.0, op, ": mask_probability ", m.mask_probability,
               " + random_probability ", m.random_probability, " exceed 1");
  std::vector<int64_t> in_vocab;  // the distinct special ids of the vocab
  for (int64_t id : m.special_ids)
    if (id >= 0 && id < m.vocab_size) in_vocab.push_back(id);
  std::sort(in_vocab.begin(), in_vocab.end());
  in_vocab.erase(std::unique(in_vocab.begin(), in_vocab.end()), in_vocab.end());
  FRUGAL_CHECK(int64_t(in_vocab.size()) < m.vocab_size, op, ": every id of the vocab of ", m.vocab_size,
               " is special; a random replacement needs one that is not");
  const auto random_token = [&] {
    int64_t id;
    do id = draw_below(gen, m.vocab_size);
    while (special(id));
    return id;
  };
  // An id outside the vocab would pass through as a label (an error far away, in the loss)
  // or be turned into [MASK] with no target.
  for (size_t i = 0; i < ids.size(); ++i)
    FRUGAL_CHECK(ids[i] >= 0 && ids[i] < m.vocab_size, op, ": id ", ids[i], " at position ", i,
                 " is outside the vocab of ", m.vocab_size, " ids");
  int64_t selected = 0, eligible = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    labels[i] = -100;
    if (special(ids[i])) continue;
    ++eligible;
    if (draw_uniform(gen) >= m.select_probability) continue;
    ++selected;
    labels[i] = ids[i];
    const double r = draw_uniform(gen);
    if (r < m.mask_probability) ids[i] = m.mask_id;
    else if (r < m.mask_probability + m.random_probability) ids[i] = random_token();
  }
  if (selected == 0 && eligible > 0) {  // every sequence with a non-special id predicts something
    int64_t k = draw_below(gen, eligible);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (special(ids[i]) || k-- > 0) continue;
      labels[i] = ids[i], ids[i] = m.mask_id;
      return 1;
    }
  }
  return selected;
}

}  // namespace frugal::data
