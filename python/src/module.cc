// bagpipe._core: the runtime for Python (python/bagpipe/ is the layer a PyTorch loop uses).
//
//   Config             trainer_hooks/job_config.h JobConfig, field for field (enums as names)
//   Schema             data/schema.h (for data given as a Python iterable)
//   Job, Trainer       python/src/py_job.h
//   parse_train_args   `bagpipe train`'s flags (apps/train_flags.h) -> (Config, other flags)
//   MetricsWriter      core/metrics.h JsonLinesWriter
//   initial_rows       core/row_init.h: a table's initial rows, as the servers create them
//   initial_dense_parameters, initial_logreg_parameters  the C++ heads' initial parameters
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "apps/train_flags.h"
#include "core/json_fields.h"
#include "core/metrics.h"
#include "core/row_init.h"
#include "core/version.h"
#include "model/dense_model.h"
#include "model/logreg_head.h"
#include "pybind11/numpy.h"
#include "pybind11/pybind11.h"
#include "pybind11/stl.h"
#include "python/src/mpi_state.h"
#include "python/src/py_job.h"

namespace bagpipe::python {
namespace py = pybind11;

absl::Status MpiState::Start(absl::Duration peer_timeout) {
  if (used) {
    return absl::FailedPreconditionError(
        "under mpirun a process runs one bagpipe job (its ranks' transport carries one job)");
  }
  if (session == nullptr) {
    absl::StatusOr<MpiJob> job = StartMpiJob(peer_timeout);
    if (!job.ok()) return job.status();
    session = std::move(job->session);
    transport = std::move(job->transport);
  }
  used = true;
  return absl::OkStatus();
}

void MpiState::Shutdown() {
  transport.reset();
  session.reset();
}

MpiState& Mpi() {
  static MpiState* state = new MpiState();  // lives until Shutdown at exit
  return *state;
}

namespace {

template <typename T>
T OrRaise(absl::StatusOr<T> value, const char* error = "ConfigError") {
  if (!value.ok()) RaiseError(error, std::string(value.status().message()));
  return *std::move(value);
}

void BindConfig(py::module_& m) {
  py::class_<JobConfig>(m, "Config",
                        "Every option of a job (bagpipe train's flags, with '_' for '-'); see "
                        "trainer_hooks/job_config.h. Validated when a Job starts.")
      .def(py::init<>())
      .def_readwrite("data", &JobConfig::data)
      .def_property(
          "schema", [](const JobConfig& c) { return c.source.schema; },
          [](JobConfig& c, const std::string& v) { c.source.schema = v; })
      .def_property(
          "skip_bad_lines", [](const JobConfig& c) { return c.source.skip_bad_lines; },
          [](JobConfig& c, bool v) { c.source.skip_bad_lines = v; })
      .def_property(
          "row_budget", [](const JobConfig& c) { return c.source.row_budget; },
          [](JobConfig& c, int64_t v) { c.source.row_budget = v; })
      .def_property(
          "max_samples", [](const JobConfig& c) { return c.source.max_samples; },
          [](JobConfig& c, int64_t v) { c.source.max_samples = v; })
      .def_readwrite("batch_size", &JobConfig::batch_size)
      .def_readwrite("iterations", &JobConfig::iterations)
      .def_readwrite("epochs", &JobConfig::epochs)
      .def_readwrite("eval_fraction", &JobConfig::eval_fraction)
      .def_readwrite("trainers", &JobConfig::trainers)
      .def_readwrite("servers", &JobConfig::servers)
      .def_property(
          "device", [](const JobConfig& c) { return std::string(BackendName(c.device)); },
          [](JobConfig& c, const std::string& v) { c.device = OrRaise(ParseBackend(v)); })
      .def_property(
          "server_link", [](const JobConfig& c) { return c.server_link.ToString(); },
          [](JobConfig& c, const std::string& v) { c.server_link = OrRaise(LinkModel::Parse(v)); })
      .def_property(
          "peer_timeout", [](const JobConfig& c) { return absl::ToDoubleSeconds(c.peer_timeout); },
          [](JobConfig& c, double v) {
            // absl::Seconds(NaN) is an infinite duration: it would switch the timeouts off.
            if (std::isnan(v)) RaiseError("ConfigError", "--peer-timeout nan: must be > 0");
            c.peer_timeout = absl::Seconds(v);
          })
      .def_property(
          "cache", [](const JobConfig& c) { return std::string(CachePolicyName(c.cache)); },
          [](JobConfig& c, const std::string& v) { c.cache = OrRaise(ParseCachePolicy(v)); })
      .def_readwrite("cache_rows", &JobConfig::cache_rows)
      .def_readwrite("lookahead", &JobConfig::lookahead)
      .def_readwrite("prefetch_depth", &JobConfig::prefetch_depth)
      .def_readwrite("plan_queue_depth", &JobConfig::plan_queue_depth)
      .def_readwrite("writeback_horizon", &JobConfig::writeback_horizon)
      .def_readwrite("oracle_split_parts", &JobConfig::oracle_split_parts)
      .def_readwrite("oracle_split_min_rows", &JobConfig::oracle_split_min_rows)
      .def_readwrite("dim", &JobConfig::dim)
      .def_property(
          "optimizer",
          [](const JobConfig& c) { return std::string(OptimizerName(c.optimizer.kind)); },
          [](JobConfig& c, const std::string& v) {
            c.optimizer.kind = OrRaise(ParseOptimizerKind(v));
          })
      .def_property(
          "lr", [](const JobConfig& c) { return c.optimizer.learning_rate; },
          [](JobConfig& c, float v) { c.optimizer.learning_rate = v; })
      .def_property(
          "eps", [](const JobConfig& c) { return c.optimizer.eps; },
          [](JobConfig& c, float v) { c.optimizer.eps = v; })
      .def_property(
          "initial_accumulator", [](const JobConfig& c) { return c.optimizer.initial_accumulator; },
          [](JobConfig& c, float v) { c.optimizer.initial_accumulator = v; })
      .def_property(
          "dense_optimizer",
          [](const JobConfig& c) -> py::object {
            if (!c.dense_optimizer.has_value()) return py::none();
            return py::str(std::string(OptimizerName(*c.dense_optimizer)));
          },
          [](JobConfig& c, py::object v) {
            if (v.is_none()) {
              c.dense_optimizer.reset();
            } else {
              if (!py::isinstance<py::str>(v)) {
                throw py::type_error(
                    absl::StrCat("Config.dense_optimizer: expected a str or None, got ",
                                 std::string(py::str(py::type::of(v).attr("__name__")))));
              }
              c.dense_optimizer = OrRaise(ParseOptimizerKind(v.cast<std::string>()));
            }
          })
      .def_readwrite("dense_lr", &JobConfig::dense_lr)
      .def_readwrite("dense_eps", &JobConfig::dense_eps)
      .def_readwrite("dense_initial_accumulator", &JobConfig::dense_initial_accumulator)
      .def_readwrite("seed", &JobConfig::seed)
      .def_readwrite("deterministic", &JobConfig::deterministic)
      .def_readwrite("collect_parameters", &JobConfig::collect_parameters)
      .def_readwrite("checkpoint_dir", &JobConfig::checkpoint_dir)
      .def_readwrite("checkpoint_every", &JobConfig::checkpoint_every)
      // Internal (not an option): set with checkpoint_every (bagpipe.Config.__setattr__).
      .def_readwrite("_checkpoint_every_given", &JobConfig::checkpoint_every_given)
      .def_readwrite("keep_checkpoints", &JobConfig::keep_checkpoints)
      .def_readwrite("resume", &JobConfig::resume)
      .def(
          "dense_optimizer_config",
          [](const JobConfig& c) {
            const OptimizerConfig d = c.DenseOptimizer();
            py::dict out;
            out["optimizer"] = std::string(OptimizerName(d.kind));
            out["lr"] = d.learning_rate;
            out["eps"] = d.eps;
            out["initial_accumulator"] = d.initial_accumulator;
            return out;
          },
          "The dense model's optimizer after defaults: {optimizer, lr, eps, initial_accumulator}.")
      .def(
          "validate",
          [](const JobConfig& c) {
            if (absl::Status s = c.Validate(); !s.ok())
              RaiseError("ConfigError", std::string(s.message()));
          },
          "Raises ConfigError naming the options that are out of range or contradict each other.")
      .def("to_json", [](const JobConfig& c) { return DumpJson(c.ToJson()); })
      .def("copy", [](const JobConfig& c) { return JobConfig(c); });
}

// `bagpipe train`'s flags: (Config, {model, bottom, top, out, metrics_out, ...}). --help prints
// the help and raises SystemExit(0); a parse error prints it and raises SystemExit(2); options
// that contradict each other raise ConfigError.
py::tuple ParseTrainArgs(std::vector<std::string> args, const std::string& prog,
                         const std::string& description) {
  CLI::App app(description, prog);
  TrainFlags flags;
  AddTrainFlags(&app, &flags);
  RequireDecimalNumbers(&app);
  app.footer(std::string(kTrainFooter) + "\n" + kDataHelp);
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    py::print(app.help(), py::arg("end") = "");
    PyErr_SetObject(PyExc_SystemExit, py::int_(0).ptr());
    throw py::error_already_set();
  } catch (const CLI::ParseError& error) {
    py::print(
        absl::StrCat(prog, ": error: ", error.what(), "\nRun with --help for more information."),
        py::arg("file") = py::module_::import("sys").attr("stderr"));
    PyErr_SetObject(PyExc_SystemExit, py::int_(2).ptr());
    throw py::error_already_set();
  }
  if (absl::Status status = FinishTrainFlags(&flags); !status.ok()) {
    RaiseError("ConfigError", std::string(status.message()));
  }
  py::dict other;
  other["model"] = flags.model;
  other["bottom"] = flags.bottom;
  other["top"] = flags.top;
  other["out"] = flags.out;
  other["metrics_out"] = flags.metrics_out;
  other["metrics_interval"] = flags.metrics_interval;
  other["summary_json"] = flags.summary_json;
  other["dump_params"] = flags.dump_params;
  other["quiet"] = flags.data.quiet;
  return py::make_tuple(flags.config, other);
}

// An integer argument of Schema (an int or a numpy integer; not a bool, a float or a string).
int64_t SchemaInt(py::handle value, const std::string& what) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    throw py::type_error(
        absl::StrCat("Schema: ", what, " must be an int, got ",
                     py::str(py::type::of(value).attr("__name__")).cast<std::string>()));
  }
  const py::int_ number = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  int overflow = 0;
  const long long result = PyLong_AsLongLongAndOverflow(number.ptr(), &overflow);
  if (overflow != 0) {
    RaiseError("ConfigError", absl::StrCat("Schema: ", what, " is out of the int64 range"));
  }
  return result;
}

Schema MakeSchema(py::object table_rows, py::object num_dense_arg,
                  std::optional<std::vector<std::string>> table_names,
                  std::optional<std::vector<std::string>> dense_names) {
  Schema schema;
  if (py::isinstance<py::str>(table_rows) || py::isinstance<py::bytes>(table_rows) ||
      !py::isinstance<py::sequence>(table_rows)) {
    throw py::type_error("Schema: table_rows must be a list of row counts");
  }
  const py::sequence rows = table_rows;
  for (size_t t = 0; t < rows.size(); ++t) {
    schema.table_rows.push_back(SchemaInt(rows[t], absl::StrCat("table_rows[", t, "]")));
  }
  const int64_t num_dense64 = SchemaInt(num_dense_arg, "num_dense");
  if (num_dense64 > std::numeric_limits<int16_t>::max()) {
    RaiseError("ConfigError", absl::StrCat("Schema: num_dense ", num_dense64, " is too large"));
  }
  const int num_dense = static_cast<int>(std::max<int64_t>(num_dense64, -1));
  if (num_dense < 0) RaiseError("ConfigError", "Schema: num_dense < 0");
  if (table_names.has_value()) {
    if (table_names->size() != schema.table_rows.size()) {
      RaiseError("ConfigError", "Schema: table_names and table_rows differ in length");
    }
    schema.table_names = *table_names;
  } else {
    for (size_t t = 0; t < schema.table_rows.size(); ++t) {
      schema.table_names.push_back(absl::StrCat("table", t));
    }
  }
  if (dense_names.has_value()) {
    if (static_cast<int>(dense_names->size()) != num_dense) {
      RaiseError("ConfigError", "Schema: dense_names and num_dense differ");
    }
    schema.dense_names = *dense_names;
  } else {
    for (int d = 0; d < num_dense; ++d) schema.dense_names.push_back(absl::StrCat("dense", d));
  }
  if (schema.table_rows.empty()) RaiseError("ConfigError", "Schema: no tables");
  const absl::Status counts = schema.CheckRowCounts(1);
  if (!counts.ok()) RaiseError("ConfigError", absl::StrCat("Schema: ", counts.message()));
  return schema;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Bagpipe runtime bindings (use the `bagpipe` package)";
  m.attr("__version__") = BAGPIPE_VERSION;
  BindConfig(m);

  py::class_<Schema>(m, "Schema", "Tables and dense features of data given as an iterable.")
      .def(py::init(&MakeSchema), py::arg("table_rows"), py::arg("num_dense") = py::int_(0),
           py::arg("table_names") = py::none(), py::arg("dense_names") = py::none())
      .def_readonly("table_rows", &Schema::table_rows)
      .def_readonly("table_names", &Schema::table_names)
      .def_readonly("dense_names", &Schema::dense_names)
      .def_property_readonly("num_tables", &Schema::num_tables)
      .def_property_readonly("num_dense", &Schema::num_dense)
      .def("__repr__", [](const Schema& s) {
        return absl::StrCat("Schema(", s.num_tables(), " tables, ", s.TotalRows(), " rows, ",
                            s.num_dense(), " dense)");
      });

  py::class_<PyTrainer, std::shared_ptr<PyTrainer>>(m, "Trainer")
      .def_property_readonly("id", &PyTrainer::id)
      .def_property_readonly("num_trainers", &PyTrainer::num_trainers)
      .def_property_readonly("device", &PyTrainer::device)
      .def("begin_iteration", &PyTrainer::BeginIteration)
      .def("begin_eval_batch", &PyTrainer::BeginEvalBatch)
      .def("lookup_pooled", &PyTrainer::LookupPooled)
      .def("lookup_pooled_into", &PyTrainer::LookupPooledInto)
      .def("end_iteration", &PyTrainer::EndIteration)
      .def("all_reduce_", &PyTrainer::AllReduce)
      .def("flush", &PyTrainer::Flush)
      .def("complete", &PyTrainer::Complete)
      .def("stats_json", &PyTrainer::StatsJson)
      .def("set_external_stream", &PyTrainer::SetExternalStream)
      .def("set_loop_state", &PyTrainer::SetLoopState, py::arg("save"), py::arg("restore"))
      .def("first_iteration", &PyTrainer::FirstIteration);

  py::class_<JobCore, std::shared_ptr<JobCore>>(m, "Job")
      .def(py::init(&JobCore::Create), py::arg("config"), py::arg("data"), py::arg("eval_data"),
           py::arg("normalize"), py::arg("schema"), py::arg("checkpoint_identity") = py::str("{}"),
           py::arg("checkpoint_defaults") = py::str("{}"))
      .def("trainers", &JobCore::trainers)
      .def_property_readonly("rank", &JobCore::rank)
      .def_property_readonly("world_size", &JobCore::world_size)
      .def_property_readonly("mpirun", &JobCore::mpirun)
      .def_property_readonly("num_trainers",
                             [](const JobCore& j) { return j.options().layout.trainers; })
      .def_property_readonly("servers", [](const JobCore& j) { return j.options().layout.servers; })
      .def_property_readonly("cache_rows",
                             [](const JobCore& j) { return j.options().trainer.cache_rows; })
      .def_property_readonly("schema", &JobCore::schema)
      .def_property_readonly("description", &JobCore::description)
      // A copy: the job's own options (summary.json's) cannot be changed after it started.
      .def_property_readonly("config", [](const JobCore& j) { return JobConfig(j.config()); })
      .def_property_readonly("closed", &JobCore::closed)
      .def_property_readonly("aborted",
                             [](const JobCore& j) -> py::object {
                               const absl::Status status = j.aborted();
                               if (status.ok()) return py::none();
                               return py::str(std::string(status.message()));
                             })
      .def("abort", &JobCore::Abort)
      .def("request_stop", &JobCore::RequestStop, py::arg("signal"))
      .def("finish", &JobCore::Finish)
      .def("close", &JobCore::Close);

  py::class_<JsonLinesWriter>(m, "MetricsWriter", "JSON lines, flushed as written (metrics.jsonl).")
      .def(py::init([](const std::string& path, std::vector<std::string> replaces) {
             std::unique_ptr<JsonLinesWriter> writer = OrRaise(JsonLinesWriter::Open(path));
             writer->set_stale_on_fresh_start(std::move(replaces));
             return writer.release();
           }),
           py::arg("path"), py::arg("replaces") = std::vector<std::string>())
      .def(
          "start",
          [](JsonLinesWriter& w, int64_t keep_through_iteration,
             std::optional<std::vector<int64_t>> run_files) {
            if (absl::Status status = w.Start(keep_through_iteration, run_files); !status.ok()) {
              // Started twice (or after a write), or into another run's file, is the caller's
              // mistake.
              RaiseError(absl::IsFailedPrecondition(status) ? "UsageError" : "JobError",
                         std::string(status.message()));
            }
          },
          py::arg("keep_through_iteration"), py::arg("run_files") = py::none())
      .def_property_readonly("first_lines", &JsonLinesWriter::first_lines)
      .def("write_json", [](JsonLinesWriter& w, const std::string& text) {
        nlohmann::json record = nlohmann::json::parse(text, nullptr, false);
        if (record.is_discarded()) RaiseError("UsageError", "MetricsWriter: not JSON");
        if (absl::Status status = w.Write(record); !status.ok()) {
          RaiseError("JobError", std::string(status.message()));
        }
      });

  m.def("parse_train_args", &ParseTrainArgs, py::arg("args"), py::arg("prog"),
        py::arg("description") = "");
  m.def(
      "initial_rows",
      [](uint64_t seed, int dim, const std::vector<int64_t>& table_rows, int table) {
        if (table < 0 || table >= static_cast<int>(table_rows.size())) {
          RaiseError("ConfigError", absl::StrCat("initial_rows: no table ", table));
        }
        const RowInitializer init(seed, dim, 0, 0.0f, table_rows);
        py::array_t<float> rows({table_rows[table], static_cast<int64_t>(dim)});
        float* out = rows.mutable_data();
        const RowId first = init.table_offsets()[table];
        for (int64_t r = 0; r < table_rows[table]; ++r) init.Init(first + r, out + r * dim);
        return rows;
      },
      py::arg("seed"), py::arg("dim"), py::arg("table_rows"), py::arg("table"),
      "The initial rows [rows x dim] of `table`, exactly as the embedding servers create them.");
  m.def(
      "initial_dense_parameters",
      [](int num_dense, int num_tables, int dim, std::vector<int> bottom, std::vector<int> top,
         uint64_t seed) {
        DenseModelConfig config;
        config.num_dense = num_dense;
        config.num_tables = num_tables;
        config.dim = dim;
        config.bottom = std::move(bottom);
        config.top = std::move(top);
        config.seed = seed;
        config.deterministic = false;  // true would set OpenBLAS's threads for the process
        std::unique_ptr<DenseModel> model =
            OrRaise(DenseModel::Create(DeviceContext::Cpu(), std::move(config)));
        std::vector<float> flat;
        if (absl::Status status = model->ReadParameters(&flat); !status.ok()) {
          RaiseError("JobError", std::string(status.message()));
        }
        py::list layers;
        for (const DenseModel::LayerShape& layer : model->layers()) {
          py::array_t<float> weight({layer.out, layer.in});
          std::copy_n(flat.data() + layer.weight_offset, static_cast<size_t>(layer.in) * layer.out,
                      weight.mutable_data());
          py::array_t<float> bias(layer.out);
          std::copy_n(flat.data() + layer.bias_offset, layer.out, bias.mutable_data());
          layers.append(py::make_tuple(weight, bias));
        }
        return layers;
      },
      py::arg("num_dense"), py::arg("num_tables"), py::arg("dim"), py::arg("bottom"),
      py::arg("top"), py::arg("seed"),
      "The C++ DLRM's initial layers (bottom MLP, then top MLP), as `bagpipe train --model dlrm` "
      "starts them: a list of (weight [out x in], bias [out]).");
  m.def(
      "initial_logreg_parameters",
      [](int num_tables, int dim, uint64_t seed) {
        std::unique_ptr<LogRegHead> head =
            OrRaise(LogRegHead::Create(DeviceContext::Cpu(), num_tables, dim, seed, {}));
        std::vector<float> flat;
        if (absl::Status status = head->ReadParameters(&flat); !status.ok()) {
          RaiseError("JobError", std::string(status.message()));
        }
        const int64_t width = static_cast<int64_t>(flat.size()) - 1;
        py::array_t<float> weight({int64_t{1}, width});
        std::copy_n(flat.data(), width, weight.mutable_data());
        py::array_t<float> bias(1);
        bias.mutable_data()[0] = flat.back();
        return py::make_tuple(weight, bias);
      },
      py::arg("num_tables"), py::arg("dim"), py::arg("seed"),
      "The embedding-only logistic regression's initial (weight [1 x tables*dim], bias [1]), as "
      "`bagpipe train --model logreg` starts them.");
  m.def("cuda_compiled_in", &CudaCompiledIn);
  m.def("launched_by_mpirun", &LaunchedByMpirun);
  m.def("_shutdown", [] {
    py::gil_scoped_release release;
    // A closed job's reading thread that returns from the data iterable now can still end;
    // during the interpreter's finalisation it could not (see WaitForDetachedJobs).
    WaitForDetachedJobs(absl::Seconds(10));
    Mpi().Shutdown();
  });
  m.def("_forget_threads_in_child", &ForgetDetachedJobsInChild);
}

}  // namespace bagpipe::python
