#include "absl/strings/str_cat.h"
#include "apps/command.h"

namespace bagpipe {

const char kDataHelp[] =
    "Data sources (--data):\n"
    "  synthetic[:k=v,...]  seeded Criteo-like stream; keys: samples, tables, rows=a/b/c, scale,\n"
    "                       alpha (Zipf), pooling=P|MIN-MAX, dense, drift, seed\n"
    "  criteo:PATH          Criteo TSV (Kaggle train.txt, Terabyte day_N); --row-budget N\n"
    "                       hashes categorical values mod N instead of a dictionary\n"
    "  csv:PATH             CSV with a header and --schema, e.g.\n"
    "                       \"label=rating>3.5; dense=year; sparse=userId,movieId,genres\"\n"
    "  bin:PATH             Bagpipe binary columnar file (bagpipe convert)\n";

void AddDataFlags(CLI::App* app, DataFlags* flags) {
  app->add_option("--data", flags->data,
                  "data source: synthetic[:k=v,...], criteo:PATH, csv:PATH or bin:PATH")
      ->capture_default_str();
  app->add_option("--schema", flags->options.schema,
                  "CSV column spec: label=COL[>X]; dense=C,log(C); sparse=C,split(C,|)");
  app->add_flag("--skip-bad-lines", flags->options.skip_bad_lines,
                "count and skip malformed lines instead of failing");
  app->add_option("--row-budget", flags->options.row_budget,
                  "Criteo: hash categorical values mod N rows per table (0 = dictionary)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--max-samples", flags->options.max_samples,
                  "read at most this many samples per epoch (-1 = all)");
}

absl::StatusOr<std::unique_ptr<SampleSource>> OpenFromFlags(const DataFlags& flags) {
  return OpenSource(flags.data, flags.options);
}

}  // namespace bagpipe
