// The one Python binding of the C++ core (fastload._native). Thin on purpose:
// takes any contiguous buffer without copying, releases the GIL for the work,
// returns numpy arrays owned by capsules, and turns a Status into
// `FormatError(message, offset, code)`, which fastload.shards.index wraps into
// ShardFormatError.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "gather.h"
#include "index_format.h"
#include "tar_scan.h"
#ifdef FASTLOAD_HAVE_JPEG
#include "jpeg_crop.h"
#endif

namespace nb = nanobind;
using fastload::MemberTable;
using fastload::Status;

namespace {

PyObject* g_format_error = nullptr;

[[noreturn]] void RaiseFormatError(const Status& s) {
  // Messages quote names from the archive, which need not be valid UTF-8.
  nb::object message = nb::steal(PyUnicode_DecodeUTF8(
      s.message.data(), static_cast<Py_ssize_t>(s.message.size()), "backslashreplace"));
  if (!message.is_valid()) throw nb::python_error();
  nb::object args = nb::make_tuple(message, s.offset, static_cast<int>(s.code));
  PyErr_SetObject(g_format_error, args.ptr());
  throw nb::python_error();
}

// A contiguous view of any buffer-protocol object (writable if asked: the buffer
// then refuses to be read-only), released on exit.
class BufferView {
 public:
  explicit BufferView(nb::handle obj, bool writable = false) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      throw nb::python_error();
    }
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  // Only for a view made writable.
  uint8_t* mutable_data() const { return static_cast<uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

using Pieces = nb::ndarray<const int64_t, nb::shape<-1, 4>, nb::c_contig, nb::device::cpu>;

// Holds every buffer for the whole copy (an mmap with exports cannot be closed
// meanwhile), checks every piece, then copies with the GIL released.
int64_t GatherInto(nb::handle dst, nb::sequence sources, const Pieces& pieces) {
  BufferView out(dst, /*writable=*/true);
  std::vector<std::unique_ptr<BufferView>> views;
  std::vector<fastload::GatherSource> srcs;
  for (nb::handle src : sources) {
    views.push_back(std::make_unique<BufferView>(src));
    srcs.push_back({views.back()->data(), views.back()->size()});
  }
  static_assert(sizeof(fastload::GatherPiece) == 4 * sizeof(int64_t), "piece rows are 4 int64");
  const auto* rows = reinterpret_cast<const fastload::GatherPiece*>(pieces.data());
  const size_t n = pieces.shape(0);
  nb::gil_scoped_release release;
  return fastload::Gather(srcs.data(), srcs.size(), rows, n, out.mutable_data(), out.size());
}

// A file read through pread windows rather than mapped: if it shrinks while it
// is scanned, the scan fails with an error instead of dying of SIGBUS.
class FileSource final : public fastload::ByteSource {
 public:
  // Returns 0 or an errno value; needs no GIL.
  int Open(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return errno;
    struct stat st;
    if (::fstat(fd_, &st) != 0) return errno;
    if (!S_ISREG(st.st_mode)) return EINVAL;
    size_ = static_cast<uint64_t>(st.st_size);
    return 0;
  }
  ~FileSource() override {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t size() const override { return size_; }

  const uint8_t* Read(uint64_t off, size_t n, Status* st) override {
    if (off >= win_off_ && off - win_off_ + n <= win_len_) return buf_.data() + (off - win_off_);
    size_t want = n > kWindow ? n : kWindow;
    if (want > size_ - off) want = static_cast<size_t>(size_ - off);
    if (buf_.size() < want) buf_.resize(want);
    size_t got = 0;
    while (got < want) {
      ssize_t r = ::pread(fd_, buf_.data() + got, want - got, static_cast<off_t>(off + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        *st = Status::Error(fastload::ErrorCode::kIo,
                            std::string("read failed: ") + std::strerror(errno), off + got);
        return nullptr;
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    if (got < n) {
      win_len_ = 0;
      *st = Status::Error(fastload::ErrorCode::kIo,
                          "the file changed while it was read: it now ends at byte " +
                              std::to_string(off + got) + ", not " + std::to_string(size_),
                          off + got);
      return nullptr;
    }
    win_off_ = off;
    win_len_ = got;
    return buf_.data();
  }

 private:
  // Bytes read at a time: several small members' headers per read, and little
  // waste when members are large and headers far apart.
  static constexpr size_t kWindow = 32 << 10;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::vector<uint8_t> buf_;
  uint64_t win_off_ = 0;
  size_t win_len_ = 0;
};

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> ToNumpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner);
}

nb::dict TableToDict(MemberTable&& t) {
  nb::dict d;
  d["shard_size"] = t.shard_size;
  d["names"] = nb::bytes(t.names.data(), t.names.size());
  d["offsets"] = ToNumpy(std::move(t.offsets));
  d["sizes"] = ToNumpy(std::move(t.sizes));
  d["name_offsets"] = ToNumpy(std::move(t.name_offsets));
  d["sample_first"] = ToNumpy(std::move(t.sample_first));
  d["sample_count"] = ToNumpy(std::move(t.sample_count));
  return d;
}

// Scans a file through pread windows; raises OSError or FormatError.
void ScanPath(const nb::bytes& path, MemberTable* table) {
  std::string p(path.c_str(), path.size());
  FileSource file;
  int err = 0;
  Status st;
  {
    nb::gil_scoped_release release;
    err = file.Open(p);
    if (err == 0) st = fastload::ScanSource(&file, table);
  }
  if (err != 0) {
    errno = err;
    PyErr_SetFromErrnoWithFilename(PyExc_OSError, p.c_str());
    throw nb::python_error();
  }
  if (!st.ok()) RaiseFormatError(st);
}

void ScanBuffer(nb::handle buffer, MemberTable* table) {
  BufferView view(buffer);
  Status st;
  {
    nb::gil_scoped_release release;
    st = fastload::ScanTar(view.data(), view.size(), table);
  }
  if (!st.ok()) RaiseFormatError(st);
}

nb::bytes SerializeToBytes(const MemberTable& table) {
  std::string out;
  {
    nb::gil_scoped_release release;
    out = fastload::SerializeIndex(table);
  }
  return nb::bytes(out.data(), out.size());
}

#ifdef FASTLOAD_HAVE_JPEG
PyObject* g_jpeg_error = nullptr;

[[noreturn]] void RaiseJpegError(const fastload::JpegStatus& s) {
  nb::object args = nb::make_tuple(nb::str(s.message.c_str()), static_cast<int>(s.kind));
  PyErr_SetObject(g_jpeg_error, args.ptr());
  throw nb::python_error();
}

nb::tuple JpegInfoOf(nb::handle buffer) {
  BufferView view(buffer);
  fastload::JpegInfo info;
  fastload::JpegStatus st;
  {
    nb::gil_scoped_release release;
    st = fastload::ReadJpegInfo(view.data(), view.size(), &info);
  }
  if (!st.ok()) RaiseJpegError(st);
  return nb::make_tuple(info.width, info.height, info.components, info.color_space,
                        info.progressive);
}

nb::ndarray<nb::numpy, uint8_t, nb::ndim<3>> DecodeRegion(nb::handle buffer, uint32_t left,
                                                          uint32_t top, uint32_t width,
                                                          uint32_t height, int scale_denom,
                                                          bool gray, uint64_t max_pixels) {
  BufferView view(buffer);
  fastload::JpegRegion region;
  region.left = left;
  region.top = top;
  region.width = width;
  region.height = height;
  region.scale_denom = scale_denom;
  region.gray = gray;
  region.max_pixels = max_pixels;
  auto* heap = new std::vector<uint8_t>();
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  fastload::JpegStatus st;
  {
    nb::gil_scoped_release release;
    st = fastload::DecodeJpegRegion(view.data(), view.size(), region, heap);
  }
  if (!st.ok()) RaiseJpegError(st);
  const size_t channels = gray ? 1 : 3;
  return nb::ndarray<nb::numpy, uint8_t, nb::ndim<3>>(heap->data(), {height, width, channels},
                                                      owner);
}
#endif  // FASTLOAD_HAVE_JPEG

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "fastload's C++ core: tar scanning, the shard index format and the batch gather.";

  g_format_error = PyErr_NewException("fastload._native.FormatError", PyExc_ValueError, nullptr);
  if (g_format_error == nullptr) throw nb::python_error();
  m.attr("FormatError") = nb::borrow(g_format_error);

  m.attr("INDEX_VERSION") = fastload::kIndexVersion;
  m.attr("INDEX_MAGIC") = nb::bytes(fastload::kIndexMagic, sizeof(fastload::kIndexMagic));

  m.def(
      "scan",
      [](nb::handle buffer) {
        MemberTable table;
        ScanBuffer(buffer, &table);
        return TableToDict(std::move(table));
      },
      nb::arg("buffer"),
      "Scan a tar held in a contiguous buffer (bytes, memoryview, mmap, numpy uint8)\n"
      "into its member table: a dict of numpy arrays 'offsets', 'sizes', 'name_offsets',\n"
      "'sample_first', 'sample_count', the 'names' blob and 'shard_size'.\n"
      "Raises FormatError(message, offset, code) for a malformed or refused archive.");

  m.def(
      "scan_file",
      [](nb::bytes path) {
        MemberTable table;
        ScanPath(path, &table);
        return TableToDict(std::move(table));
      },
      nb::arg("path"),
      "Like scan(), for a file path (bytes, os.fsencode'd), read in pread windows (a file\n"
      "that shrinks meanwhile is a FormatError with code 11, never SIGBUS).\n"
      "Raises OSError if it cannot be opened and FormatError if it is malformed.");

  m.def(
      "build_index",
      [](nb::handle buffer) {
        MemberTable table;
        ScanBuffer(buffer, &table);
        return SerializeToBytes(table);
      },
      nb::arg("buffer"),
      "Scan a tar buffer and return its serialised .idx sidecar as bytes.\n"
      "Raises FormatError for a malformed or refused archive.");

  m.def(
      "build_index_file",
      [](nb::bytes path) {
        MemberTable table;
        ScanPath(path, &table);
        return SerializeToBytes(table);
      },
      nb::arg("path"),
      "Scan a tar file (pread windows) and return its serialised .idx sidecar as bytes.\n"
      "Raises OSError or FormatError.");

  m.def(
      "validate_index",
      [](nb::handle buffer) {
        BufferView view(buffer);
        fastload::IndexLayout l;
        Status st;
        {
          nb::gil_scoped_release release;
          st = fastload::ValidateIndex(view.data(), view.size(), &l);
        }
        if (!st.ok()) RaiseFormatError(st);
        nb::dict d;
        d["shard_size"] = l.shard_size;
        d["num_members"] = l.num_members;
        d["num_samples"] = l.num_samples;
        d["names_bytes"] = l.names_bytes;
        d["offsets_at"] = l.offsets_at;
        d["sizes_at"] = l.sizes_at;
        d["name_offsets_at"] = l.name_offsets_at;
        d["sample_first_at"] = l.sample_first_at;
        d["sample_count_at"] = l.sample_count_at;
        d["names_at"] = l.names_at;
        return d;
      },
      nb::arg("buffer"),
      "Validate a serialised index in place and return where its arrays lie (byte\n"
      "offsets) with its counts. Raises FormatError if it is corrupt or truncated.");

  m.def("gather", &GatherInto, nb::arg("dst"), nb::arg("sources"), nb::arg("pieces"),
        "Copy byte ranges of several buffers into the writable buffer dst, with the GIL\n"
        "released for the whole copy. pieces: a C-contiguous int64 array of rows\n"
        "(source index, source offset, size, dst offset). Every row is checked first:\n"
        "returns -1 when all were in bounds and copied, else the first row that is not\n"
        "(nothing is copied then).");

  m.def(
      "dali_index",
      [](nb::handle buffer) {
        BufferView view(buffer);
        std::string text;
        Status st;
        {
          nb::gil_scoped_release release;
          MemberTable table;
          st = fastload::ParseIndex(view.data(), view.size(), &table);
          if (st.ok()) st = fastload::DaliIndexText(table, &text);
        }
        if (!st.ok()) RaiseFormatError(st);
        return nb::bytes(text.data(), text.size());
      },
      nb::arg("index"),
      "Render a serialised index as DALI's webdataset index text (wds2idx 'v1.2').\n"
      "Raises FormatError if the index is corrupt or a name holds whitespace.");

#ifdef FASTLOAD_HAVE_JPEG
  g_jpeg_error = PyErr_NewException("fastload._native.JpegError", PyExc_ValueError, nullptr);
  if (g_jpeg_error == nullptr) throw nb::python_error();
  m.attr("JpegError") = nb::borrow(g_jpeg_error);
  m.attr("HAVE_JPEG") = true;

  m.def("jpeg_info", &JpegInfoOf, nb::arg("buffer"),
        "Read a JPEG's header: (width, height, components, libjpeg color space, progressive).\n"
        "Raises JpegError(message, kind) if the header is corrupt or truncated.");

  m.def("decode_jpeg_region", &DecodeRegion, nb::arg("buffer"), nb::arg("left"), nb::arg("top"),
        nb::arg("width"), nb::arg("height"), nb::arg("scale_denom"), nb::arg("gray"),
        nb::arg("max_pixels"),
        "Decode a region of a JPEG (in the pixels of the image scaled by 1/scale_denom,\n"
        "1, 2, 4 or 8) to an HWC uint8 array of 3 (RGB) or 1 (gray) channels, with the GIL\n"
        "released. Raises JpegError(message, kind): kind 1 corrupt, 2 truncated,\n"
        "3 unsupported (CMYK/YCCK), 4 too many pixels, 5 region outside the image.");
#else
  m.attr("HAVE_JPEG") = false;
#endif
}
