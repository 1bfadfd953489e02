// A strategy that builds GPT-2 itself: the one line check_model_free.cmake must name.
#pragma once
// models::Gpt in a comment is fine

namespace fourway {
template <class T, class B>
using Chunk = models::Gpt<T, B>;
}  // namespace fourway
