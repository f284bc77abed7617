#include "data/schema.h"

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/excerpt.h"
#include "core/json_fields.h"
#include "core/status.h"

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

absl::Status Schema::CheckRowCounts(int64_t min_rows) const {
  if (table_rows.size() > static_cast<size_t>(kMaxTables)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the schema has ", table_rows.size(), " tables: at most ", kMaxTables));
  }
  int64_t total = 0;
  for (size_t t = 0; t < table_rows.size(); ++t) {
    const std::string name = t < table_names.size() ? Excerpt(table_names[t]) : absl::StrCat(t);
    if (table_rows[t] < min_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schema table '", name, "' has ", table_rows[t], " rows (at least ", min_rows, ")"));
    }
    const std::optional<int64_t> sum = CheckedAdd(total, table_rows[t]);
    if (!sum || *sum > kMaxTotalRows) {
      return absl::InvalidArgumentError(
          absl::StrCat("schema tables hold more than 2^62 rows in all (table '", name, "' has ",
                       table_rows[t], ")"));
    }
    total = *sum;
  }
  return absl::OkStatus();
}

nlohmann::json Schema::ToJson() const {
  return {{"dense", dense_names}, {"tables", table_names}, {"table_rows", table_rows}};
}

absl::StatusOr<Schema> Schema::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("malformed schema JSON: not an object");
  Schema schema;
  auto names = [&](const char* key, std::vector<std::string>* out) -> absl::Status {
    const auto it = json.find(key);
    if (it == json.end() || !it->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed schema JSON: \"", key, "\" is not a list"));
    }
    for (const nlohmann::json& name : *it) {
      if (!name.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("malformed schema JSON: \"", key, "\" lists a ", name.type_name()));
      }
      out->push_back(name.get<std::string>());
    }
    return absl::OkStatus();
  };
  absl::Status status = names("dense", &schema.dense_names);
  if (status.ok()) status = names("tables", &schema.table_names);
  if (!status.ok()) return status;
  const auto rows = json.find("table_rows");
  if (rows == json.end() || !rows->is_array()) {
    return absl::InvalidArgumentError("malformed schema JSON: \"table_rows\" is not a list");
  }
  if (rows->size() != schema.table_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat("schema lists ", schema.table_names.size(),
                                                   " tables but ", rows->size(), " table sizes"));
  }
  for (size_t t = 0; t < rows->size(); ++t) {
    absl::StatusOr<int64_t> size = JsonToInt64((*rows)[t], "table_rows");
    if (!size.ok()) return Annotate(size.status(), "malformed schema JSON");
    if (*size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("schema table '", Excerpt(schema.table_names[t]), "' has negative size"));
    }
    schema.table_rows.push_back(*size);
  }
  RETURN_IF_ERROR(schema.CheckRowCounts(0));
  return schema;
}

}  // namespace bagpipe
