// The logger's compiled dispatcher kernel (holmes.logger._native): a boxed C++ kernel for the
// c10d collectives at the AutogradCPU dispatch key, built on first use by
// torch.utils.cpp_extension and loaded by holmes/logger/_native.py.
//
// Why: a Python kernel at the dispatcher converts every argument of the operator (a tensor list,
// two ScriptObjects, the returned Work) to Python and back, 11-17 us per operator with warm caches
// and 60-250 us between two gradient buckets of a backward pass. This kernel reads the process
// group, the message size and the clock in C++, makes one call into Python with four integers to
// number the operator (the recorder's own counters, so the namespace wrappers and this kernel
// share one sequence per communicator), redispatches below autograd, and ends the operator from a
// C++ callback on the work's future: the end is read on the backend's thread the moment the work
// completes, without waiting for the GIL, and kept in a buffer that Python drains at its next
// flush. Operators on other devices (AutogradCUDA...) and the point-to-point operators keep the
// Python kernel registered at the Autograd alias key.

#include <torch/extension.h>
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include <time.h>

namespace py = pybind11;

namespace {

// how the message size is read from the sized argument
enum How : int { kNone = 0, kOne = 1, kList = 2, kNested = 3 };

struct Spec {
  int64_t opk;  // the recorder's packed (op, peer) key
  int gi;       // index of the process group argument
  int si;       // index of the sized argument, -1 for none
  int how;
};

struct State {
  std::unordered_map<std::string, Spec> specs;
  std::unique_ptr<torch::Library> lib;
  py::object issue;    // issue(pg_id, opk, nbytes, start_ns) -> key (>= 0) or -1 (unknown group)
  py::object resolve;  // resolve(pg_id, process_group): make the group known to issue()
  std::atomic<bool> active{false};
  std::mutex mu;
  std::atomic<int64_t> tag{0};  // the recorder being recorded into (its operators' keys are its own)
  std::vector<std::array<int64_t, 3>> ends;  // (tag, key, end_ns) of completed operators
  std::atomic<int64_t> seen{0};
  std::atomic<int64_t> failed{0};
};

State* state() {
  static State* s = new State();  // never destroyed: callbacks may outlive the interpreter's teardown
  return s;
}

inline int64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);  // the clock of Python's time.time_ns()
  return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

int64_t nbytes_of(const c10::IValue& v, int how) {
  int64_t n = 0;
  if (how == kOne) {
    if (v.isTensor()) n = static_cast<int64_t>(v.toTensor().nbytes());
  } else if (how == kList) {
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList().vec()) n += static_cast<int64_t>(t.nbytes());
  } else if (how == kNested) {
    if (v.isList())
      for (const c10::IValue& inner : v.toListRef())
        if (inner.isTensorList())
          for (const at::Tensor& t : inner.toTensorList().vec()) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

void push_end(int64_t tag, int64_t key, int64_t end) {
  State* s = state();
  std::lock_guard<std::mutex> g(s->mu);
  s->ends.push_back({tag, key, end});
}

// Number the operator in Python (the GIL is taken for one call); -1 when it cannot be recorded.
int64_t issue(const Spec& sp, const c10::IValue& pg_arg, int64_t nbytes, int64_t start) {
  State* s = state();
  auto pg = pg_arg.toCustomClass<c10d::ProcessGroup>();
  const int64_t pg_id = static_cast<int64_t>(reinterpret_cast<intptr_t>(pg.get()));
  py::gil_scoped_acquire gil;
  if (!s->active.load(std::memory_order_relaxed) || !s->issue) return -1;
  try {
    int64_t key = s->issue(pg_id, sp.opk, nbytes, start).cast<int64_t>();
    if (key < 0 && s->resolve) {  // a group seen for the first time
      s->resolve(pg_id, py::cast(pg));
      key = s->issue(pg_id, sp.opk, nbytes, start).cast<int64_t>();
    }
    return key;
  } catch (py::error_already_set& e) {  // logging must never break the training step
    e.discard_as_unraisable(__func__);
    s->failed.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  State* s = state();
  const c10::DispatchKeySet below = ks & c10::after_autograd_keyset;
  if (!s->active.load(std::memory_order_relaxed)) {
    op.redispatchBoxed(below, stack);
    return;
  }
  const int64_t start = now_ns();
  const int64_t tag = s->tag.load(std::memory_order_relaxed);
  int64_t key = -1;
  auto it = s->specs.find(op.schema().name());
  if (it != s->specs.end()) {
    const Spec& sp = it->second;
    const size_t nargs = op.schema().arguments().size();
    try {
      auto args = torch::jit::last(*stack, nargs);
      const int64_t nbytes = sp.si >= 0 ? nbytes_of(args[sp.si], sp.how) : 0;
      key = issue(sp, args[sp.gi], nbytes, start);
    } catch (const std::exception&) {
      s->failed.fetch_add(1, std::memory_order_relaxed);
      key = -1;
    }
  }
  // an exception here (it failed before it was issued) leaves it in flight, as a synchronous one
  op.redispatchBoxed(below, stack);
  if (key < 0) return;
  s->seen.fetch_add(1, std::memory_order_relaxed);
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    const c10::IValue& out = stack->back();  // the Work is the last of the returns
    if (out.isCustomClass()) fut = out.toCustomClass<c10d::Work>()->getFuture();
  } catch (const std::exception&) {
    fut.reset();
  }
  if (!fut) {  // no future: it ended when it returned
    push_end(tag, key, now_ns());
    return;
  }
  // a work that failed (the process group's timeout, a peer gone) never completed: the operator
  // stays in flight, where a hang dump writes it as started
  fut->addCallback([tag, key](c10::ivalue::Future& f) {
    if (!f.hasError()) push_end(tag, key, now_ns());
  });
}

// Register the kernel (once per process: the registration is kept, see uninstall) and record
// through the given callbacks from now on.
void install(const py::dict& specs, py::object issue_fn, py::object resolve_fn) {
  State* s = state();
  if (!s->lib) {
    s->specs.clear();
    for (auto item : specs) {
      auto t = item.second.cast<py::tuple>();
      s->specs["c10d::" + item.first.cast<std::string>()] =
          Spec{t[0].cast<int64_t>(), t[1].cast<int>(), t[2].cast<int>(), t[3].cast<int>()};
    }
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d", c10::DispatchKey::AutogradCPU,
                                                __FILE__, __LINE__);
    for (const auto& kv : s->specs)
      lib->impl(kv.first.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
    s->lib = std::move(lib);
  }
  s->issue = std::move(issue_fn);
  s->resolve = std::move(resolve_fn);
  s->active.store(true);
}

// Stop recording: the kernel stays registered as a pass-through (a C++ redispatch). Registering
// and removing it at every enable/disable made every later c10d call of the process slower, the
// more so the more cycles (measured 2026-11-28: +1.4 to +3.7 ms a 52-operator step after 100-300
// cycles, with the kernel never called); unregister() removes it for good.
void uninstall() {
  State* s = state();
  s->active.store(false);
  s->issue = py::object();
  s->resolve = py::object();
}

void unregister() {
  uninstall();
  state()->lib.reset();
}

// record into recorder `tag` (on), or only redispatch (off)
void set_active(bool on, int64_t tag) {
  State* s = state();
  s->tag.store(tag);
  s->active.store(on && static_cast<bool>(s->lib));
}

// the (key, end_ns) of recorder `tag`'s operators completed since its last drain
std::vector<std::pair<int64_t, int64_t>> drain(int64_t tag) {
  State* s = state();
  std::vector<std::pair<int64_t, int64_t>> out;
  std::lock_guard<std::mutex> g(s->mu);
  size_t keep = 0;
  for (size_t i = 0; i < s->ends.size(); ++i) {
    const auto& e = s->ends[i];
    if (e[0] == tag)
      out.emplace_back(e[1], e[2]);
    else
      s->ends[keep++] = e;
  }
  s->ends.resize(keep);
  return out;
}

// End an operator issued elsewhere (the namespace wrappers' asynchronous fast path) when `work`
// completes, as the kernel's own: False when the work has no future (the caller's path then).
bool watch(int64_t tag, int64_t key, const c10::intrusive_ptr<c10d::Work>& work) {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    fut = work->getFuture();
  } catch (const std::exception&) {
    return false;
  }
  if (!fut) return false;
  fut->addCallback([tag, key](c10::ivalue::Future& f) {
    if (!f.hasError()) push_end(tag, key, now_ns());
  });
  return true;
}

py::dict counters() {
  State* s = state();
  py::dict d;
  d["seen"] = s->seen.load();
  d["failed"] = s->failed.load();
  d["installed"] = static_cast<bool>(s->lib);
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "holmes.logger's compiled c10d dispatcher kernel (AutogradCPU)";
  m.def("install", &install, "register the kernel for the given c10d operators");
  m.def("uninstall", &uninstall, "stop recording (the kernel stays registered, a pass-through)");
  m.def("unregister", &unregister, "stop recording and remove the kernel");
  m.def("set_active", &set_active, "record (True) or only redispatch (False)");
  m.def("drain", &drain, "the (key, end_ns) of the operators completed since the last drain");
  m.def("watch", &watch, "end operator `key` of recorder `tag` when `work` completes");
  m.def("counters", &counters, "operators seen and recording failures");
  m.def("now_ns", &now_ns, "the kernel's clock (CLOCK_REALTIME, ns)");
}
