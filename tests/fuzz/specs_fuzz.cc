// Fuzz harness: the parsers of spec strings given on the command line or in a Python Config.
// Input: one options byte, then the string. Bits 0-2 of the options byte pick the parser:
//   0  ParseSyntheticConfig, then OpenSource("synthetic:" + string) and a few reads (bits 3-7:
//      samples per read - 1), when the batches stay small
//   1  LinkModel::Parse (--server-link)
//   2  ParsePoolingMode
//   3  ParseBackend
//   4  ParseCpuStreams
//   5  ParseOptimizerKind
//   6  ParseLayers (--bottom, --top)
//   7  ParseCachePolicy
// ParseLayers and ParseCachePolicy live in libraries the fuzz build does not compile (model/
// needs BLAS and the dense backends, oracle/ the whole planner): there, 6 and 7 do nothing, and
// ctest's replay (BAGPIPE_SPECS_FULL, normal build) runs them over the seeds and regressions.
//
// Invariants: an error message is at most 2000 bytes of printable ASCII; a parsed value printed
// in its canonical form parses back to the same value (a link: its ToString, to 3 digits, with a
// bandwidth from 1 bit/s to 1e9 Gbit/s and a finite latency); a synthetic source's schema is the
// parsed config's, and its batches are valid for it (bag sizes within pooling=, labels 0 or 1,
// finite dense values, epochs of the expected length).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cache/pooling.h"
#include "core/device.h"
#include "core/optimizer.h"
#include "data/source.h"
#include "data/synthetic.h"
#include "sync/transport.h"
#include "tests/fuzz/fuzz_util.h"
#if BAGPIPE_SPECS_FULL
#include "model/dense_model.h"
#include "oracle/planner.h"
#endif

namespace bagpipe {
namespace {

// Ids a harness read may produce (tables x largest bag x samples); larger shapes are opened and
// checked but not read, so that one input stays within libFuzzer's memory and time limits.
constexpr int64_t kMaxReadIds = int64_t{1} << 16;
constexpr int64_t kMaxReadDense = int64_t{1} << 16;

// The spec that ParseSyntheticConfig must read back as `config` (scale already applied).
std::string CanonicalSpec(const SyntheticConfig& config) {
  return absl::StrFormat("samples=%d,rows=%s,alpha=%.17g,pooling=%d-%d,dense=%d,drift=%d,seed=%d",
                         config.samples, absl::StrJoin(config.table_rows, "/"), config.alpha,
                         config.pooling_min, config.pooling_max, config.dense, config.drift,
                         static_cast<int64_t>(config.seed));
}

bool SameConfig(const SyntheticConfig& a, const SyntheticConfig& b) {
  return a.samples == b.samples && a.table_rows == b.table_rows && a.alpha == b.alpha &&
         a.pooling_min == b.pooling_min && a.pooling_max == b.pooling_max && a.dense == b.dense &&
         a.drift == b.drift && a.seed == b.seed;
}

void FuzzSynthetic(const std::string& spec, int64_t chunk) {
  const absl::StatusOr<SyntheticConfig> config = ParseSyntheticConfig(spec);
  if (!config.ok()) {
    CheckMessage(config.status(), "");
    return;
  }
  if (config->table_rows.empty()) FuzzFail("a synthetic config without tables");
  for (const int64_t rows : config->table_rows) {
    if (rows < 1) FuzzFail(absl::StrCat("a table of ", rows, " rows"));
  }
  if (!(config->alpha > 0) || config->pooling_min < 0 ||
      config->pooling_max < config->pooling_min || config->dense < 0 || config->samples < 0 ||
      config->drift < 0) {
    FuzzFail(absl::StrCat("an out-of-range synthetic config: ", CanonicalSpec(*config)));
  }
  const std::string canonical = CanonicalSpec(*config);
  const absl::StatusOr<SyntheticConfig> again = ParseSyntheticConfig(canonical);
  if (!again.ok()) {
    FuzzFail(
        absl::StrCat("the canonical spec '", canonical, "' fails: ", again.status().message()));
  }
  if (!SameConfig(*config, *again)) {
    FuzzFail(absl::StrCat("'", canonical, "' parses to ", CanonicalSpec(*again)));
  }

  SourceOptions options;
  options.max_samples = 2 * chunk + 1;
  absl::StatusOr<std::unique_ptr<SampleSource>> source =
      OpenSource(absl::StrCat("synthetic:", spec), options);
  if (!source.ok()) {
    CheckMessage(source.status(), "");
    return;
  }
  const Schema& schema = (*source)->schema();
  if (schema.table_rows != config->table_rows || schema.num_dense() != config->dense ||
      schema.num_tables() != static_cast<int>(schema.table_names.size())) {
    FuzzFail(absl::StrCat("the source's schema differs from the config ", canonical));
  }
  const int64_t tables = static_cast<int64_t>(config->table_rows.size());
  if (tables * config->pooling_max * chunk > kMaxReadIds || config->dense * chunk > kMaxReadDense) {
    return;
  }
  const int64_t expected = std::min<int64_t>(config->samples, options.max_samples);
  Batch batch;
  for (int epoch = 0; epoch < 2; ++epoch) {
    int64_t total = 0;
    while (true) {
      absl::StatusOr<int64_t> read = (*source)->Read(chunk, &batch);
      if (!read.ok()) return CheckMessage(read.status(), "");
      if (*read == 0) break;
      if (*read != batch.num_samples || *read > chunk) FuzzFail("a read returned a wrong count");
      if (batch.first_sample != epoch * expected + total) FuzzFail("a wrong first_sample");
      total += *read;
      const absl::Status valid = batch.Validate(schema);
      if (!valid.ok()) FuzzFail(absl::StrCat("an invalid batch: ", valid.message()));
      for (const float label : batch.labels) {
        if (label != 0 && label != 1) FuzzFail(absl::StrCat("label ", label));
      }
      for (const float value : batch.dense) {
        if (!std::isfinite(value)) FuzzFail(absl::StrCat("dense value ", value));
      }
      for (int64_t b = 0; b + 1 < static_cast<int64_t>(batch.offsets.size()); ++b) {
        const int64_t bag = batch.offsets[b + 1] - batch.offsets[b];
        if (bag < config->pooling_min || bag > config->pooling_max) {
          FuzzFail(absl::StrCat("a bag of ", bag, " ids outside pooling=", config->pooling_min, "-",
                                config->pooling_max));
        }
      }
    }
    if (total != expected) {
      FuzzFail(absl::StrCat("an epoch of ", total, " samples, not ", expected));
    }
    const absl::Status rewound = (*source)->Rewind();
    if (!rewound.ok()) return CheckMessage(rewound, "");
  }
}

void FuzzLink(const std::string& text) {
  const absl::StatusOr<LinkModel> link = LinkModel::Parse(text);
  if (!link.ok()) return CheckMessage(link.status(), "");
  // Each message's delivery time is computed from these (see LinkModel::Parse).
  if (!(link->bytes_per_second == 0 ||
        (link->bytes_per_second >= 1.0 / 8 && link->bytes_per_second <= 1e18 / 8))) {
    FuzzFail(absl::StrCat("bandwidth ", link->bytes_per_second, " bytes/s from '", text, "'"));
  }
  if (link->latency < absl::ZeroDuration() || link->latency == absl::InfiniteDuration()) {
    FuzzFail(absl::StrCat("latency ", absl::FormatDuration(link->latency)));
  }
  // ToString is what Python's Config.server_link reads back: it must parse to the same link, the
  // bandwidth to its 3 printed significant digits.
  const std::string printed = link->ToString();
  const absl::StatusOr<LinkModel> again = LinkModel::Parse(printed);
  if (!again.ok()) {
    FuzzFail(absl::StrCat("'", printed, "' does not parse back: ", again.status().message()));
  }
  if (again->latency != link->latency ||
      !(std::abs(again->bytes_per_second - link->bytes_per_second) <=
        5e-3 * link->bytes_per_second)) {
    FuzzFail(absl::StrCat("'", printed, "' parses back as '", again->ToString(), "'"));
  }
}

// Parses `text` with `parse`; a value must come back from its canonical name `name`.
template <typename T, typename Parse, typename Name>
void FuzzEnum(const std::string& text, Parse parse, Name name) {
  const absl::StatusOr<T> value = parse(text);
  if (!value.ok()) return CheckMessage(value.status(), "");
  const std::string canonical(name(*value));
  const absl::StatusOr<T> again = parse(canonical);
  if (!again.ok() || *again != *value) {
    FuzzFail(absl::StrCat("the canonical name '", canonical, "' does not parse back"));
  }
}

#if BAGPIPE_SPECS_FULL
void FuzzLayers(const std::string& text) {
  const absl::StatusOr<std::vector<int>> layers = ParseLayers(text);
  if (!layers.ok()) return CheckMessage(layers.status(), "");
  if (layers->empty()) FuzzFail("no layers");
  for (const int size : *layers) {
    if (size <= 0) FuzzFail(absl::StrCat("layer size ", size));
  }
  const std::string canonical = FormatLayers(*layers);
  const absl::StatusOr<std::vector<int>> again = ParseLayers(canonical);
  if (!again.ok() || *again != *layers) {
    FuzzFail(absl::StrCat("'", canonical, "' does not parse back"));
  }
}
#endif

}  // namespace
}  // namespace bagpipe

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagpipe;
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (flags & 7) {
    case 0:
      FuzzSynthetic(text, 1 + (flags >> 3));
      break;
    case 1:
      FuzzLink(text);
      break;
    case 2:
      FuzzEnum<PoolingMode>(text, ParsePoolingMode, PoolingName);
      break;
    case 3:
      FuzzEnum<Backend>(text, ParseBackend, [](Backend backend) { return BackendName(backend); });
      break;
    case 4:
      FuzzEnum<CpuStreams>(text, ParseCpuStreams, CpuStreamsName);
      break;
    case 5:
      FuzzEnum<OptimizerKind>(text, ParseOptimizerKind, OptimizerName);
      break;
#if BAGPIPE_SPECS_FULL
    case 6:
      FuzzLayers(text);
      break;
    case 7:
      FuzzEnum<CachePolicy>(text, ParseCachePolicy, CachePolicyName);
      break;
#endif
    default:
      break;
  }
  return 0;
}
