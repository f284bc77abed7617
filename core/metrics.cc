#include "core/metrics.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace bagpipe {

absl::StatusOr<std::unique_ptr<JsonLinesWriter>> JsonLinesWriter::Open(const std::string& path) {
  if (path == "-")
    return std::unique_ptr<JsonLinesWriter>(new JsonLinesWriter(stdout, path, false));
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open metrics file '", path, "' for writing: ", std::strerror(errno)));
  }
  return std::unique_ptr<JsonLinesWriter>(new JsonLinesWriter(file, path, true));
}

JsonLinesWriter::~JsonLinesWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (owned_) std::fclose(file_);
}

void JsonLinesWriter::Write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& value) {
  std::ofstream out(path);
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open '", path, "' for writing: ", std::strerror(errno)));
  }
  out << value.dump(2) << "\n";
  if (!out) return absl::DataLossError(absl::StrCat("failed writing '", path, "'"));
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  nlohmann::json value = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not valid JSON"));
  }
  return value;
}

}  // namespace bagpipe
