// Files written so that a crash, a kill or a full disk never leaves a half-written one: every file
// tapestry saves (checkpoints, optimizer state, tokenizers, run records, pictures) goes through
// write_file_atomic, at the bottom of the layers so that each of them can.
#pragma once
#include <string>

namespace tapestry {

// Writes bytes to path through a temp file beside it (flushed and fsync'd), renamed over path, then
// the directory fsync'd. Any failure (full disk, bad directory) throws a tapestry::Error naming the
// file and leaves an existing file untouched.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace tapestry
