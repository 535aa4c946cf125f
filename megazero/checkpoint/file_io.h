// Durable file operations for checkpoints: nothing the user asked us to write
// is ever left half-written under its final name. Files are written, flushed
// and fsynced; directories are renamed into place atomically and their parent
// fsynced so the rename itself survives a power loss.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace megazero::checkpoint {

// Writes `content` to `path` through a temporary sibling, fsyncs, renames over
// `path` and fsyncs the directory. Throws ConfigError naming the path.
void write_file_atomically(const std::string& path, std::string_view content);
// Whole file as a string (at most `max_bytes`); ConfigError naming the path.
std::string read_small_file(const std::string& path, std::uint64_t max_bytes = 64u << 20);
void fsync_path(const std::string& path);  // a file or a directory
// XXH3-64 of a file's contents, streamed.
std::uint64_t file_xxh3(const std::string& path);
// XXH3-64 of bytes in memory.
std::uint64_t bytes_xxh3(const std::string& bytes);
std::string hex64(std::uint64_t v);
std::uint64_t parse_hex64(const std::string& s);  // throws std::runtime_error

}  // namespace megazero::checkpoint
