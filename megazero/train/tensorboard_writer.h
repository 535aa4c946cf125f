// TensorBoard event files (--tensorboard-dir DIR): the training scalars (loss,
// learning rate, loss scale, ...) as TensorBoard and every tool that reads
// Megatron's logs expect them, so `tensorboard --logdir DIR` plots a megazero
// run as it would a Megatron-LM one.
//
// What it writes: one file per writer, DIR/events.out.tfevents.<unix
// seconds>.<hostname>.<pid>.<n> (n counts the writers of this process from 0,
// as TensorFlow's writers do), holding TFRecords: each a little-endian uint64
// length, the masked CRC32C of those 8 bytes, the data, the masked CRC32C of
// the data. Each record's data is a tensorboard.Event protobuf
// (tensorboard_event.proto, TensorBoard's schema): the first has
// file_version "brain.Event:2", every add_scalar() one Summary with one
// simple_value. The protobuf is serialised by the protobuf library and the
// CRC32C is Boost.CRC's, so the format is the libraries', not ours.
//
// Writes go through a buffered stream: flush() hands them to the OS (no
// fsync), and the destructor flushes. One writer per run is enough: Megatron
// writes from one rank only. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace megazero::train {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) if it does not exist, and a new event
  // file in it. ConfigError naming --tensorboard-dir when the directory or the
  // file cannot be created.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();  // flushes; a failure is a warning on stderr (never throws)
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar at a training step (TensorBoard's x axis). The value is stored
  // as a float, as TensorBoard's simple_value is; NaN and +-Inf are kept.
  // ConfigError naming --tensorboard-dir if the write fails.
  void add_scalar(const std::string& tag, std::int64_t step, double value);
  // Hands the buffered records to the OS, so that TensorBoard sees them.
  // ConfigError naming --tensorboard-dir if the write fails (e.g. disk full).
  void flush();

  // The event file being written.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  void check_stream(const char* what);

  std::string dir_;
  std::string path_;
  std::ofstream out_;
};

// The TFRecord framing, exposed for tests and readers.
namespace tfrecord {
// CRC32C (Castagnoli, reflected, init and final xor 0xffffffff).
std::uint32_t crc32c(const void* data, std::size_t size);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t masked_crc32c(const void* data, std::size_t size);
// `data` framed as one TFRecord.
std::string frame(std::string_view data);
}  // namespace tfrecord

}  // namespace megazero::train
