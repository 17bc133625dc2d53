// classify: the trained classifier, compiled ahead of time by XLA.
//
//   classify [--batch=1] [--logits=FILE] IDX_FOLDER   test accuracy and speed
//   classify IDX_IMAGE_FILE                           the class of each image
//
// `python -m xla_mnist.aot` generates the two headers (the model at its fixed
// batch, and at batch 1) and links this file against them, passing the
// model's image shape as -DCLASSIFY_HEIGHT, -DCLASSIFY_WIDTH and
// -DCLASSIFY_CHANNELS; the class count is the compiled logits' own. Images
// are IDX files of unsigned bytes, IDX's rule that the magic number's 4th
// byte counts the dimensions: 3 (magic 2051: N, H, W) for one channel, 4
// (magic 2052: N, H, W, C) for more; labels are 1 (magic 2049: N). IDX files
// are read through zlib, which reads gzipped and plain files alike. Exit
// codes follow the Python CLI: 2 for a bad command line, 1 for bad data.

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "classifier_batch.h"
#include "classifier_one.h"

#if !defined(CLASSIFY_HEIGHT) || !defined(CLASSIFY_WIDTH) || \
    !defined(CLASSIFY_CHANNELS)
#error "compile with -DCLASSIFY_HEIGHT=H -DCLASSIFY_WIDTH=W -DCLASSIFY_CHANNELS=C, the model's image shape (build.py passes them)"
#endif

namespace {

// The model's image shape, one image's bytes.
constexpr int kHeight = CLASSIFY_HEIGHT;
constexpr int kWidth = CLASSIFY_WIDTH;
constexpr int kChannels = CLASSIFY_CHANNELS;
static_assert(kHeight > 0 && kWidth > 0 && kChannels > 0, "an image shape");
constexpr int kPixels = kHeight * kWidth * kChannels;
// IDX: 0, 0, 0x08 (unsigned bytes), then the number of dimensions.
constexpr int kUnsignedBytes = 0x0800;
constexpr int kImageDims = kChannels == 1 ? 3 : 4;
constexpr int kImageMagic = kUnsignedBytes + kImageDims;  // 2051 or 2052.
constexpr int kLabelMagic = kUnsignedBytes + 1;           // 2049.
const std::string kImages =
    "t10k-images-idx" + std::to_string(kImageDims) + "-ubyte";
const std::string kLabels = "t10k-labels-idx1-ubyte";

// Ends the program with one line, as the Python CLI does.
[[noreturn]] void Fail(const std::string& message, int code) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(code);
}

bool IsFile(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

int32_t BigEndian(const uint8_t* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) << 24 |
                              static_cast<uint32_t>(p[1]) << 16 |
                              static_cast<uint32_t>(p[2]) << 8 | p[3]);
}

// Bytes this machine can give the process now: Linux's MemAvailable, else
// the free pages.
uint64_t AvailableMemory() {
  if (FILE* info = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib;
    while (std::fgets(line, sizeof line, info) != nullptr) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        std::fclose(info);
        return kib << 10;
      }
    }
    std::fclose(info);
  }
  return static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) *
         static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
}

[[noreturn]] void Unreadable(const std::string& path, gzFile file) {
  int status;
  const std::string reason = gzerror(file, &status);
  Fail(path + " cannot be read (" +
           (status == Z_OK ? "it ends early" : reason) + "): replace the file",
       1);
}

// An image shape as the lines name it: 28x28x1.
std::string Shape(int height, int width, int channels) {
  return std::to_string(height) + "x" + std::to_string(width) + "x" +
         std::to_string(channels);
}

// The IDX image files this classify reads, in words.
std::string ImageFormat() {
  return "an IDX file of magic " + std::to_string(kImageMagic) +
         " with dimensions N, " + std::to_string(kHeight) + ", " +
         std::to_string(kWidth) +
         (kImageDims == 4 ? ", " + std::to_string(kChannels) : "");
}

// The items of an IDX file of unsigned bytes (images of the model's shape,
// or labels), its header and size checked as `idx_builder.read_idx` checks
// them: the header is read alone, and the file's size and the machine's
// memory checked against it before the items are read; a gzipped file is
// unzipped no further than its header says. An image file's dimensions are
// its own (IDX's rule: the magic number's 4th byte counts them): 3 are
// images of one channel, 4 of the last's; they must be the model's.
std::vector<uint8_t> ReadIdx(const std::string& path, bool images,
                             int* count) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) Fail(path + " cannot be opened: check the path", 1);
  uint8_t head[4 + 4 * 4];
  int got = gzread(file, head, 4);
  const int found = got == 4 ? BigEndian(head) : 0;
  const int ndim = found - kUnsignedBytes;
  const bool image_magic = ndim == 3 || ndim == 4;
  if (got == 4 && (images ? !image_magic : found != kLabelMagic)) {
    Fail(path + " has magic number " + std::to_string(found) + ", expected " +
             std::to_string(images ? kImageMagic : kLabelMagic) +
             ": not an IDX " + (images ? "image" : "label") + " file",
         1);
  }
  const int header = 4 + 4 * ndim;
  if (got == 4) {
    const int rest = gzread(file, head + 4, header - 4);
    got = rest < 0 ? rest : got + rest;
  }
  if (got < 0) Unreadable(path, file);
  if (got < header || got < 4) {
    Fail(path + " is truncated: " + std::to_string(got) +
             " bytes, no full header",
         1);
  }
  *count = BigEndian(head + 4);
  if (images) {
    const int height = BigEndian(head + 8);
    const int width = BigEndian(head + 12);
    const int channels = ndim == 4 ? BigEndian(head + 16) : 1;
    if (height != kHeight || width != kWidth || channels != kChannels) {
      Fail(path + " holds images of " + Shape(height, width, channels) +
               ", classify takes " + Shape(kHeight, kWidth, kChannels) +
               ": give it " + ImageFormat(),
           1);
    }
  }
  if (*count < 0) {
    Fail(path + " announces " + std::to_string(*count) +
             " items: not an IDX file",
         1);
  }
  const uint64_t items =
      static_cast<uint64_t>(*count) * (images ? kPixels : 1);
  const uint64_t expected = header + items;
  const std::string announces = "its header announces " +
                                std::to_string(*count) + " items (" +
                                std::to_string(expected) + " bytes)";
  struct stat info;
  const bool gzipped = !gzdirect(file);
  const uint64_t size = stat(path.c_str(), &info) == 0 ? info.st_size : 0;
  // Deflate's worst case: stored blocks, 5 bytes per 64 KiB, and gzip's
  // header and trailer.
  if ((!gzipped && size != expected) || size > expected * 1.001 + 4096) {
    Fail(path + " is truncated or padded: " + std::to_string(size) +
             " bytes" + (gzipped ? " gzipped" : "") + ", " + announces +
             ": replace the file",
         1);
  }
  const uint64_t available = AvailableMemory();
  if (items + size * gzipped > available) {
    Fail(path + ": " + announces + ", reading it needs " +
             std::to_string((items + size * gzipped) >> 20) +
             " MiB and this machine has " + std::to_string(available >> 20) +
             " MiB available: use a smaller IDX file or free memory",
         1);
  }
  std::vector<uint8_t> data(items + 1);  // One more: a padded file fills it.
  uint64_t done = 0;
  int n;
  while (done < data.size() &&
         (n = gzread(file, &data[done],
                     static_cast<unsigned>(std::min<uint64_t>(
                         data.size() - done, 1 << 20)))) > 0) {
    done += n;
  }
  if (done < data.size() && n < 0) Unreadable(path, file);
  int status;
  gzerror(file, &status);
  if (status != Z_OK && status != Z_STREAM_END) {
    Unreadable(path, file);
  }
  gzclose_r(file);
  if (done != items) {
    Fail(path + " is truncated or padded: " +
             std::to_string(header + done) + " bytes, " + announces +
             ": replace the file",
         1);
  }
  data.pop_back();
  return data;
}

// `name` in `folder`, gzipped or not.
std::string FindFile(const std::string& folder, const std::string& name) {
  for (const std::string& candidate : {name + ".gz", name}) {
    if (IsFile(folder + "/" + candidate)) return folder + "/" + candidate;
  }
  Fail(folder + "/" + name + ".gz is missing: classify reads the IDX test" +
           " set, " + kImages + ".gz and " + kLabels + ".gz (gzipped or" +
           " not); put both there, or give it an IDX image file alone to" +
           " classify its images without labels",
       1);
}

// The two compiled functions, made once.
ClassifierBatch& BatchModel() {
  static ClassifierBatch model;
  return model;
}
ClassifierOne& OneModel() {
  static ClassifierOne model;
  return model;
}

// The class count: the compiled logits' own.
int Classes() { return OneModel().result_fetch_logits_count(); }

// The fixed batch of the batch function.
int Batch() { return static_cast<int>(ClassifierBatch::ArgSize(0)) / kPixels; }

// Runs one compiled function over `images` (count x kPixels), writing logits.
template <typename Model>
void RunModel(Model& model, const uint8_t* images, int count, float* logits) {
  std::memcpy(model.arg_feed_images_data(), images,
              static_cast<size_t>(count) * kPixels);
  if (!model.Run()) Fail("the compiled model failed: " + model.error_msg(), 1);
  std::memcpy(logits, model.result_fetch_logits_data(),
              sizeof(float) * count * Classes());
}

// The logits of all images: whole batches, then the rest one by one.
std::vector<float> Classify(const std::vector<uint8_t>& images, int count,
                            bool batch_one) {
  const int batch = Batch();
  const size_t classes = Classes();
  std::vector<float> logits(static_cast<size_t>(count) * classes);
  int i = 0;
  for (; !batch_one && i + batch <= count; i += batch) {
    RunModel(BatchModel(), &images[static_cast<size_t>(i) * kPixels], batch,
             &logits[i * classes]);
  }
  for (; i < count; ++i) {
    RunModel(OneModel(), &images[static_cast<size_t>(i) * kPixels], 1,
             &logits[i * classes]);
  }
  return logits;
}

int ArgMax(const float* logits) {
  return static_cast<int>(std::max_element(logits, logits + Classes()) -
                          logits);
}

// Writes float32 logits (count x classes, native byte order) to `path` whole:
// a temporary file renamed into place.
void WriteLogits(const std::string& path, const std::vector<float>& logits) {
  const std::string temp = path + ".tmp";
  FILE* out = std::fopen(temp.c_str(), "wb");
  bool ok = out != nullptr && std::fwrite(logits.data(), sizeof(float),
                                          logits.size(), out) == logits.size();
  if (out != nullptr) ok = std::fclose(out) == 0 && ok;
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    Fail("cannot write " + path + ": check that its folder is writable", 1);
  }
}

void Usage(const std::string& problem) {
  Fail(problem + " (usage: classify [--batch=1] [--logits=FILE] IDX_FOLDER" +
           " | IDX_IMAGE_FILE)",
       2);
}

// TF's framework library, which the runtime needs for Abseil, logs as it
// loads (absl's "All log messages before absl::InitializeLog()", the oneDNN
// notice, the failed CUDA probe), before main and whatever
// TF_CPP_MIN_LOG_LEVEL says. An executable's preinit functions run before
// any library's initializers: this one sends stderr to /dev/null for that
// time, and main takes it back. TF_CPP_MIN_LOG_LEVEL below 3 keeps it all.
int saved_stderr = -1;

// glibc passes preinit functions the environment: getenv is not ready yet.
void HideLibraryStartUp(int, char**, char** envp) {
  const char kLevel[] = "TF_CPP_MIN_LOG_LEVEL=";
  for (char** var = envp; var && *var; ++var) {
    if (std::strncmp(*var, kLevel, sizeof(kLevel) - 1) == 0 &&
        std::atoi(*var + sizeof(kLevel) - 1) < 3) {
      return;
    }
  }
  const int null = open("/dev/null", O_WRONLY);
  if (null < 0) return;
  saved_stderr = dup(2);
  dup2(null, 2);
  close(null);
}

__attribute__((section(".preinit_array"), used)) void (*hide_start_up)(
    int, char**, char**) = HideLibraryStartUp;

}  // namespace

int main(int argc, char** argv) {
  if (saved_stderr >= 0) {
    dup2(saved_stderr, 2);
    close(saved_stderr);
  }
  std::set_new_handler([] {
    Fail("out of memory: free memory, or classify fewer images at once", 1);
  });
  // The shape build.py passed against the compiled function's own bytes.
  if (OneModel().arg_feed_images_count() != kPixels) {
    Fail("classify was built for images of " +
             Shape(kHeight, kWidth, kChannels) + " but its model takes " +
             std::to_string(OneModel().arg_feed_images_count()) +
             " bytes an image: export it again",
         1);
  }
  bool batch_one = false;
  std::string logits_path, path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--batch=1") {
      batch_one = true;
    } else if (arg.rfind("--logits=", 0) == 0 && arg.size() > 9) {
      logits_path = arg.substr(9);
    } else if (arg.rfind("-", 0) == 0 || !path.empty()) {
      Usage("unexpected argument " + arg);
    } else {
      path = arg;
    }
  }
  if (path.empty()) Usage("no IDX folder or image file given");
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    Fail(path + " does not exist: give the IDX test set's folder or an IDX" +
             " image file",
         1);
  }
  const bool folder = S_ISDIR(info.st_mode);
  if (!folder && !S_ISREG(info.st_mode)) {
    Fail(path + " is neither a folder nor a file: give the IDX test set's" +
             " folder or an IDX image file",
         1);
  }
  const std::string images_path = folder ? FindFile(path, kImages) : path;
  int count = 0;
  const std::vector<uint8_t> images = ReadIdx(images_path, true, &count);
  // No images, no accuracy or speed to report: 0 of 0 is not a measurement.
  if (count == 0) {
    Fail(images_path + " holds no images: give a file with at least one", 1);
  }
  std::vector<uint8_t> labels;
  if (folder) {
    const std::string labels_path = FindFile(path, kLabels);
    int label_count = 0;
    labels = ReadIdx(labels_path, false, &label_count);
    if (label_count != count) {
      Fail(images_path + " has " + std::to_string(count) + " images but " +
               labels_path + " has " + std::to_string(label_count) +
               " labels: the two files must come from one release",
           1);
    }
    for (uint8_t label : labels) {
      if (label >= Classes()) {
        Fail(labels_path + " has label " + std::to_string(label) +
                 ", outside 0.." + std::to_string(Classes() - 1),
             1);
      }
    }
  }
  Classify(images, 1, batch_one);  // Warm-up: first touch.
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> logits = Classify(images, count, batch_one);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!logits_path.empty()) WriteLogits(logits_path, logits);
  if (!folder) {
    for (int i = 0; i < count; ++i) {
      const int label = ArgMax(&logits[static_cast<size_t>(i) * Classes()]);
      std::printf("image %d: class %d\n", i, label);
    }
    return 0;
  }
  int correct = 0;
  for (int i = 0; i < count; ++i) {
    correct +=
        ArgMax(&logits[static_cast<size_t>(i) * Classes()]) == labels[i];
  }
  const int batch = batch_one ? 1 : Batch();
  std::printf("test accuracy %.4f (%d of %d images in %s)\n",
              double(correct) / count, correct, count, path.c_str());
  std::printf("%.3f us per image (batch %d; %.2f ms for %d images, files"
              " read beforehand)\n",
              seconds * 1e6 / count, batch, seconds * 1e3, count);
  return 0;
}
