#include "data/schema.h"

#include "absl/strings/str_cat.h"

namespace bagpipe {

std::vector<RowId> Schema::TableOffsets() const {
  std::vector<RowId> offsets(table_rows.size() + 1, 0);
  for (size_t t = 0; t < table_rows.size(); ++t) {
    offsets[t + 1] = offsets[t] + static_cast<RowId>(table_rows[t]);
  }
  return offsets;
}

int64_t Schema::TotalRows() const {
  int64_t total = 0;
  for (int64_t rows : table_rows) total += rows;
  return total;
}

nlohmann::json Schema::ToJson() const {
  return {{"dense", dense_names}, {"tables", table_names}, {"table_rows", table_rows}};
}

absl::StatusOr<Schema> Schema::FromJson(const nlohmann::json& json) {
  Schema schema;
  try {
    schema.dense_names = json.at("dense").get<std::vector<std::string>>();
    schema.table_names = json.at("tables").get<std::vector<std::string>>();
    schema.table_rows = json.at("table_rows").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed schema JSON: ", e.what()));
  }
  if (schema.table_rows.size() != schema.table_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat("schema lists ", schema.table_names.size(),
                                                   " tables but ", schema.table_rows.size(),
                                                   " table sizes"));
  }
  for (size_t t = 0; t < schema.table_rows.size(); ++t) {
    if (schema.table_rows[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("schema table ", schema.table_names[t], " has negative size"));
    }
  }
  return schema;
}

}  // namespace bagpipe
