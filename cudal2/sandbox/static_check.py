"""Static checks on a candidate: regex rules over its source, then symbol and instruction checks on its library.

Two layers, both cheap and both run before any candidate code executes:

1. `check_source` scans the CUDA C++ text, with comments and string/char literals blanked out (line numbers
   kept, backslash-newline splices undone), for calls, includes and definitions the contract forbids: vendor
   GEMM libraries, dynamic loading, host threads, processes, file and network I/O, environment and /proc
   reading, host timers, private streams, allocation, synchronisation, graphs, persisting-L2 windows, driver
   entry points, exit/abort, raw syscalls and definitions that could interpose CUDA or libc functions. Its value
   is early, line-numbered feedback for the policy; it is easy to evade (token pasting, macros, string
   concatenation, function pointers), so it is never the last word. `spells_programmatic_launch` is no verdict:
   it tells the harness that a source names programmatic dependent launch, whose calls must then be capturable.
2. `check_library` inspects the shared library nvcc built from the source. Every undefined dynamic symbol must
   be on an allowlist (default deny), so whatever spelling the source used, a call into a forbidden function
   that goes through the dynamic linker is caught. Defined symbols that could shadow the harness's CUDA, libc
   or timer functions are rejected, and the host code is disassembled for syscall/sysenter/int 0x80 and
   rdtsc/rdtscp/rdpid instructions.

What neither layer catches (the harness's runtime checks and the process sandbox cover behaviour):
- a candidate reaching code through plain pointer arithmetic: scanning its own GOT or libc's memory for a
  function address, jumping into the middle of an instruction whose bytes encode a syscall, or writing
  machine code into memory that is already executable;
- constructors and atexit handlers (`__attribute__((constructor))`, static objects with destructors), which
  run at load or exit time through allowed machinery;
- device-side behaviour: which kernels run, on which stream, what they read and write, how long they take,
  whether results are cached across calls, accuracy and accumulation precision;
- resource abuse through allowed calls (huge host allocations, endless loops, stdout/stderr spam).
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cudal2.sandbox.types import Violation

MAX_SOURCE_BYTES = 256_000
TOOL_TIMEOUT_S = 30
ENTRY_POINT = "cudal2_hgemm"
ENTRY_POINT_PARAMS = 9
ENTRY_SIGNATURE = (
    'extern "C" int cudal2_hgemm(const half* A, const half* B, half* C, int M, int N, int K, '
    "void* workspace, size_t workspace_bytes, cudaStream_t stream)"
)


# --------------------------------------------------------------------------------------------------------------
# Source rules
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One source rule. `scope` says which text the pattern sees: "code" (comments and literals blanked),
    "string" (the body of each ordinary string literal) or "asm" (the body of each literal inside asm(...)).
    A hit is reported at the line of the pattern's group named "at" if it has one, else where the match starts."""

    name: str
    pattern: re.Pattern[str]
    rationale: str
    scope: str = "code"


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


def _words(*names: str) -> str:
    return r"\b(?:" + "|".join(names) + r")\b"


def _calls(*names: str) -> str:
    """A free-function call (or declaration) of one of `names`: not a member (`x.f(`, `p->f(`), not a suffix."""
    return r"(?<![\w.$])(?<!->)(?:" + "|".join(names) + r")\s*\("


def _include(*headers: str) -> str:
    return r"#\s*include\s*[<\"](?:" + "|".join(headers) + r")[>\"]"


# A return type, then one of the reserved names, its parameter list (one level of nested parentheses) and a body.
_INTERPOSED_NAMES = (
    r"cuda[A-Z]\w*|cu[A-Z]\w*|__cuda\w*|cublas\w*|pthread_\w+|clock_gettime|gettimeofday|dl[mv]?open|dl[v]?sym"
    r"|malloc|calloc|realloc|free"
)
_DEFINITION = (
    r"\b(?!(?:return|else|new|delete|throw|case|goto|sizeof|co_return|co_yield)\b)[A-Za-z_]\w*[\s*&]+"
    rf"(?P<at>{_INTERPOSED_NAMES})\s*\([^;{{}}()]*(?:\([^;{{}}()]*\)[^;{{}}()]*)*\)"
    r"\s*(?:(?:const|noexcept|throw\s*\(\s*\)|__attribute__\s*\(\([^;{}]*?\)\))\s*)*\{"
)

SOURCE_RULES: tuple[Rule, ...] = (
    Rule(
        "vendor_library",
        _rx(
            r"\b(?:cublas|cublasLt|CUBLAS|cudnn|CUDNN|cusparse|cutensor)\w*",
            r"#\s*include\s*[<\"]\s*(?:cublas|cudnn|cusparse|cutensor|torch|ATen|c10)\b",
            r"\b(?:torch|at|c10|caffe2)\s*::",
        ),
        "The point of the task is to write the GEMM yourself; calling cuBLAS, cuBLASLt, cuDNN or torch is the"
        " reference, not a solution.",
    ),
    Rule(
        "dynamic_loading",
        _rx(
            _words(
                r"dl[mv]?open",
                r"dl[v]?sym",
                r"dladdr1?",
                "dlinfo",
                "dlerror",
                "dlclose",
                r"__libc_dl\w+",
                "dl_iterate_phdr",
                "_r_debug",
                "link_map",
                r"_dl_\w+",
                r"RTLD_\w+",
            ),
            _include(r"dlfcn\.h", r"link\.h"),
        ),
        "Loading libraries or looking up symbols at run time is how a candidate reaches cuBLAS or patches the"
        " harness, so it is forbidden outright.",
    ),
    Rule(
        "dynamic_loading",
        re.compile(r"\blib\w+\.so\b"),
        "Naming a shared library in a string only makes sense for loading it at run time, which is forbidden.",
        scope="string",
    ),
    Rule(
        "threads",
        _rx(
            r"\bpthread_\w+",
            r"\bstd\s*::\s*(?:thread|jthread|async)\b",
            _include("thread", "future", r"pthread\.h", r"threads\.h", r"omp\.h"),
            r"\bomp_\w+",
            r"#\s*pragma\s+omp\b",
            _words(
                "thrd_create", "cudaLaunchHostFunc", "cudaStreamAddCallback", "cuLaunchHostFunc", "cuStreamAddCallback"
            ),
        ),
        "A host thread or host callback can do work after the call has returned, outside the timed window.",
    ),
    Rule(
        "process",
        _rx(
            _calls(
                "fork",
                "vfork",
                "clone",
                "clone3",
                "execl",
                "execle",
                "execlp",
                "execv",
                "execve",
                "execvp",
                "execvpe",
                "execveat",
                "fexecve",
                "system",
                "popen",
                "posix_spawnp?",
                "ptrace",
                "kill",
                "killpg",
                "tgkill",
                "raise",
                "signal",
                "sigaction",
                "daemon",
                "prctl",
            ),
            _include(r"spawn\.h", r"sys/wait\.h", r"sys/ptrace\.h", r"sys/prctl\.h"),
        ),
        "The candidate runs inside the evaluating process; starting, signalling or tracing processes could fake"
        " or disturb the evaluation.",
    ),
    Rule(
        "file_io",
        _rx(
            _calls(
                "fopen",
                "fopen64",
                "freopen",
                "fdopen",
                "tmpfile",
                "open",
                "open64",
                "openat",
                "openat2",
                "creat",
                "creat64",
                "read",
                "pread",
                "pread64",
                "readv",
                "write",
                "pwrite",
                "pwrite64",
                "writev",
                "unlink",
                "unlinkat",
                "rename",
                "renameat2?",
                r"(?<!std::)remove",
                "truncate",
                "ftruncate",
                "mmap",
                "mmap64",
                "munmap",
                "mprotect",
                "fread",
                "fgets",
                "fscanf",
                "mkstemp",
                "mkdir",
                "rmdir",
                "chmod",
                "symlink",
                "opendir",
                "ioctl",
                "dup",
                "dup2",
                "fcntl",
            ),
            r"(?<![\w.$])(?<!->)(?:fwrite|fputs|fputc|putc)\s*\((?![^;]{0,400}\b(?:stdout|stderr)\b)",
            r"(?<![\w.$])(?<!->)v?fprintf\s*\((?!\s*(?:stdout|stderr)\b)",
            r"\bFILE\s*\*",
            r"\b(?:basic_)?[io]?fstream\b|\b(?:basic_)?filebuf\b|\bstd\s*::\s*filesystem\b",
            _include("fstream", "filesystem", r"fcntl\.h", r"sys/mman\.h", r"sys/stat\.h", r"dirent\.h"),
        ),
        "Files are out of bounds: a candidate writing files could overwrite cached libraries or results; only"
        " printf/puts/fprintf to stdout or stderr are allowed.",
    ),
    Rule(
        "network",
        _rx(
            _calls(
                "socket",
                "socketpair",
                "connect",
                r"(?<!std::)bind",
                "listen",
                "accept",
                "accept4",
                "sendto",
                "recvfrom",
                "sendmsg",
                "recvmsg",
                "getaddrinfo",
                "gethostbyname",
            ),
            _include(r"sys/socket\.h", r"sys/un\.h", r"netinet/[\w.]+", r"arpa/inet\.h", r"netdb\.h", r"curl/[\w.]+"),
            r"\bcurl\w*",
        ),
        "The evaluation is offline; a network connection could only leak or fetch results.",
    ),
    Rule(
        "environment",
        _rx(
            _words(
                "getenv",
                "secure_getenv",
                "setenv",
                "unsetenv",
                "putenv",
                "clearenv",
                "environ",
                "__environ",
                "getauxval",
                "program_invocation_name",
                "program_invocation_short_name",
                r"__progname\w*",
                "__libc_argv",
                "__libc_argc",
                "getpid",
                "getppid",
                "gettid",
            )
        ),
        "Reading the environment, the process's identity or its arguments lets a kernel tell the evaluator from"
        " real use and behave differently.",
    ),
    Rule(
        "environment",
        re.compile(r"/proc\b"),
        "Reading /proc reveals the evaluating process (its arguments, memory maps, other processes).",
        scope="string",
    ),
    Rule(
        "timing_sniffing",
        _rx(
            _words(
                "clock_gettime",
                "clock_getres",
                "gettimeofday",
                "timespec_get",
                r"cudaEventElapsedTime\w*",
                r"cudaEventRecord\w*",
                r"cudaEventCreate\w*",
                "cudaEventQuery",
                r"__rdtscp?",
                "_rdtsc",
                r"__builtin_ia32_rdtscp?",
                "__builtin_readcyclecounter",
            ),
            r"\bstd\s*::\s*chrono\b",
            _calls("clock", "time"),
        ),
        "Host timers and CUDA events let a candidate detect the timed runs and change its behaviour; timing is"
        " the harness's job.",
    ),
    Rule(
        "interposition",
        re.compile(_DEFINITION),
        "Defining a function with the name of a CUDA, cuBLAS, pthread, loader, timer or allocator API can shadow"
        " the real one inside the evaluating process; give your helpers other names.",
    ),
    Rule(
        "stream_graph_malloc_sync",
        _rx(
            _words(
                r"cudaStreamCreate\w*",
                "cudaStreamDestroy",
                r"cudaMalloc\w*",
                r"cudaFree\w*",
                "cudaHostAlloc",
                r"cudaHostRegister\w*",
                "cudaDeviceSynchronize",
                "cudaStreamSynchronize",
                "cudaEventSynchronize",
                "cudaStreamWaitEvent",
                "cudaStreamQuery",
                r"cudaGraph\w*",
                r"cudaStreamBeginCapture\w*",
                "cudaStreamEndCapture",
                "cudaStreamIsCapturing",
                r"cudaStreamGetCaptureInfo\w*",
                "cudaDeviceReset",
                r"cudaSetDevice\w*",
                "cudaThreadSynchronize",
                r"cuStream\w*",
                r"cuMemAlloc\w*",
                r"cuMemFree\w*",
                r"cuCtx\w*",
                r"cuLaunch\w*",
                r"cuGraph\w*",
            ),
            r"\bcuda(?:Memset|Memset2D|Memset3D)\s*\(",
            r"\bcudaMemcpy\w*\s*\(",
        ),
        "All device work must be queued on the given stream with no allocation, synchronisation, private streams"
        " or graphs (use the workspace and cudaMemsetAsync), so the harness's timing sees all of it; copies are"
        " forbidden in every form because a copy to or from host memory lets the call wait on the GPU or reach"
        " the harness's memory (pad with a kernel instead).",
    ),
    Rule(
        "l2_persistence",
        _rx(
            _words(
                "cudaStreamSetAttribute",
                "cudaStreamGetAttribute",
                "cuStreamSetAttribute",
                r"cuda(?:Launch|Stream)AttributeAccessPolicyWindow",
                "accessPolicyWindow",
                "cudaAccessPolicyWindow",
                "cudaDeviceSetLimit",
                "cuCtxSetLimit",
                "cudaLimitPersistingL2CacheSize",
                "cudaCtxResetPersistingL2Cache",
                "cudaAccessPropertyPersisting",
                "hitRatio",
                "hitProp",
            )
        ),
        "A persisting-L2 window keeps inputs resident across calls, which fakes speed the real workload would not see.",
    ),
    Rule(
        "driver_entry_point",
        _rx(_words(r"cudaGetDriverEntryPoint\w*", r"cuGetProcAddress\w*")),
        "Fetching driver functions by name bypasses the link check; call cuTensorMapEncodeTiled directly"
        " (CUTLASS: define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL).",
    ),
    Rule(
        "exit_abort",
        _rx(
            _calls("exit", "_exit", "_Exit", "quick_exit", "at_quick_exit", "abort", "longjmp", "siglongjmp", "atexit"),
            r"\bstd\s*::\s*terminate\b",
        ),
        "Ending the process (or jumping out of the call) from inside the evaluator could skip checks or fake a"
        " report; return a non-zero error code instead.",
    ),
    Rule(
        "raw_syscall",
        _rx(_calls("syscall"), r"\b__NR_\w+", _include(r"sys/syscall\.h", r"asm/unistd[\w.]*")),
        "Raw system calls bypass every library-level rule; a GEMM never needs one.",
    ),
    Rule(
        "raw_syscall",
        _rx(_words("syscall", "sysenter", r"rdtscp?", "rdpid"), r"\bint\s+\$?0x80\b"),
        "Host inline assembly with syscall/sysenter/int 0x80 or rdtsc reaches the kernel or a timer past every"
        " other rule.",
        scope="asm",
    ),
)


@dataclass(frozen=True)
class _Literal:
    offset: int  # in the spliced text, at the opening quote
    body: str
    in_asm: bool


@dataclass(frozen=True)
class _View:
    """The source with line splices undone: `code` has comments and literals blanked (same length as `text`)."""

    text: str
    code: str
    literals: tuple[_Literal, ...]
    newlines: tuple[int, ...]  # offsets of '\n' in text
    splices: tuple[int, ...]  # offsets in text where a backslash-newline was removed

    def line(self, offset: int) -> int:
        return 1 + bisect.bisect_left(self.newlines, offset) + bisect.bisect_right(self.splices, offset)


_SPLICE = re.compile(r"\\[ \t]*\r?\n")  # gcc also splices when blanks follow the backslash (with a warning)
_SPECIAL = re.compile(r"//|/\*|(?<![\w$])(?:u8|u|U|L)?R\"|[\"'()]")
_STRING_BODY = re.compile(r"[^\"\\\n]*(?:\\.[^\"\\\n]*)*", re.S)
_CHAR_BODY = re.compile(r"[^'\\\n]*(?:\\.[^'\\\n]*)*", re.S)
_RAW_DELIM = re.compile(r"([^()\\\s\"]{0,16})\(")
_PP_NUMBER_TAIL = re.compile(r"(?:\.\d|(?<![\w$.])\d)(?:[eEpP][+-]|[\w'.])*$")
_ASM_OPEN_TAIL = re.compile(r"\b(?:asm|__asm__|__asm)\b(?:\s*\b(?:volatile|__volatile__|inline|goto)\b)*\s*$")
_KEEP_TAIL = re.compile(r"(?:^[ \t]*#\s*(?:include|include_next|import)\s*|\b__has_include\s*\(\s*)$")


def _splice(source: str) -> tuple[str, tuple[int, ...]]:
    parts, splices, pos, size = [], [], 0, 0
    for m in _SPLICE.finditer(source):
        parts.append(source[pos : m.start()])
        size += m.start() - pos
        splices.append(size)
        pos = m.end()
    parts.append(source[pos:])
    return "".join(parts), tuple(splices)


def _blank(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


class _Scanner:
    """Splits spliced source into code and literals, keeping extern "C" and #include names in the code view."""

    def __init__(self, text: str):
        self.text = text
        self.out: list[str] = []
        self.literals: list[_Literal] = []
        self.asm_depth = 0
        self.pos = 0  # start of the token being scanned
        self.recent = ""  # the end of the code view, for look-behind decisions

    def raw_window(self, n: int = 96) -> str:
        """The last `n` characters of source before the current token (a cheap pre-filter for `tail`)."""
        return self.text[max(0, self.pos - n) : self.pos]

    def tail(self, n: int = 96) -> str:
        """The last `n` characters of the code view emitted so far."""
        return self.recent[-n:]

    def emit(self, chunk: str) -> None:
        self.out.append(chunk)
        self.recent = (self.recent + chunk)[-256:]

    def run(self) -> str:
        pos = 0
        while (m := _SPECIAL.search(self.text, pos)) is not None:
            self.emit(self.text[pos : m.start()])
            self.pos = m.start()
            pos = self.token(m)
        self.emit(self.text[pos:])
        return "".join(self.out)

    def token(self, m: re.Match[str]) -> int:
        tok, start = m.group(), m.start()
        if tok == "//":
            end = self.text.find("\n", start)
            end = len(self.text) if end < 0 else end
        elif tok == "/*":
            end = self.text.find("*/", start + 2)
            end = len(self.text) if end < 0 else end + 2
        elif tok.endswith('R"'):
            return self.raw_string(m)
        elif tok in ("(", ")"):
            self.paren(tok)
            self.emit(tok)
            return m.end()
        elif tok == "'" and self.digit_separator(m.end()):
            self.emit(tok)  # a C++14 digit separator, not a character literal
            return m.end()
        else:
            return self.quoted(start, tok)
        self.emit(_blank(self.text[start:end]))
        return end

    def digit_separator(self, after: int) -> bool:
        """A ' inside a pp-number (1'000'000, 0xFF'FF) followed by a digit or letter is not a character literal."""
        nxt, prev = self.text[after : after + 1], self.text[after - 2 : after - 1]
        if not (nxt.isalnum() or nxt == "_") or not (prev.isalnum() or prev in "._'"):
            return False
        return _PP_NUMBER_TAIL.search(self.tail()) is not None

    def paren(self, tok: str) -> None:
        if self.asm_depth:
            self.asm_depth += 1 if tok == "(" else -1
        elif tok == "(" and "asm" in self.raw_window() and _ASM_OPEN_TAIL.search(self.tail()):
            self.asm_depth = 1

    def quoted(self, start: int, quote: str) -> int:
        body_re = _STRING_BODY if quote == '"' else _CHAR_BODY
        body = body_re.match(self.text, start + 1).group()
        end = start + 1 + len(body)
        end += 1 if self.text.startswith(quote, end) else 0
        self.literal(start, end, body, keep=quote == '"' and self.keep(body))
        return end

    def raw_string(self, m: re.Match[str]) -> int:
        quote = m.end() - 1
        delim = _RAW_DELIM.match(self.text, m.end())
        if delim is None:  # not a well-formed raw string: lex the quote as an ordinary string
            self.emit(self.text[m.start() : quote])
            return self.quoted(quote, '"')
        close = ")" + delim.group(1) + '"'
        body_end = self.text.find(close, delim.end())
        body_end = len(self.text) if body_end < 0 else body_end
        end = min(len(self.text), body_end + len(close))
        self.emit(self.text[m.start() : quote])
        self.literal(quote, end, self.text[delim.end() : body_end], keep=False)
        return end

    def keep(self, body: str) -> bool:
        """Literals the code rules need: the "C" of extern "C" and header names after #include."""
        window = self.raw_window()
        if body in ("C", "C++"):
            return "extern" in window and self.tail().rstrip().endswith("extern")
        if "#" not in window and "__has_include" not in window:
            return False
        return _KEEP_TAIL.search(self.tail().rsplit("\n", 1)[-1]) is not None

    def literal(self, start: int, end: int, body: str, keep: bool) -> None:
        self.literals.append(_Literal(start, body, self.asm_depth > 0))
        self.emit(self.text[start:end] if keep else _blank(self.text[start:end]))


# Not violations: programmatic dependent launch (PDL) lets a kernel start before the kernel before it on the stream
# has finished. Inside one call that is fair (cuBLAS launches its split-K reduction that way); between calls it would
# overlap back-to-back timed calls, a gain no single call has. The harness rejects programmatic edges between calls in
# the captured graph of the timed calls, which only a capturable candidate has: a source that spells PDL is told to
# the harness (`spells_programmatic_launch`), which then rejects it if its calls cannot be captured.
PDL_RULES: tuple[Rule, ...] = (
    Rule(
        "programmatic_launch",
        _rx(_words(r"cudaLaunchAttributeProgrammatic\w*", r"programmaticStreamSerialization\w*",
                   r"cudaLaunchAttributeLaunchCompletionEvent", r"cudaGridDependencySynchronize",
                   r"cudaTriggerProgrammaticLaunchCompletion", r"launch_with_pdl", r"CUTLASS_ENABLE_GDC_FOR_SM90")),
        "the host side of PDL: the launch attribute, CUTLASS's launch_with_pdl and its device-side switch",
    ),
    Rule(
        "programmatic_launch",
        _rx(_words(r"griddepcontrol")),
        "griddepcontrol.launch_dependents / .wait: the device side of PDL",
        scope="asm",
    ),
)


def _view(source: str) -> _View:
    text, splices = _splice(source)
    scanner = _Scanner(text)
    code = scanner.run()
    newlines = tuple(m.start() for m in re.finditer("\n", text))
    return _View(text, code, tuple(scanner.literals), newlines, splices)


def _rule_hits(rule: Rule, view: _View) -> Iterator[tuple[int, str]]:
    """(offset, matched text) for every hit of `rule` in the text its scope selects."""
    if rule.scope == "code":
        for m in rule.pattern.finditer(view.code):
            yield m.start("at" if "at" in rule.pattern.groupindex else 0), m.group()
        return
    for lit in view.literals:
        if rule.scope == "asm" and not lit.in_asm or rule.scope == "string" and lit.in_asm:
            continue
        for m in rule.pattern.finditer(lit.body):
            yield lit.offset + 1 + m.start(), m.group()


def _rule_violations(rule: Rule, view: _View) -> Iterator[Violation]:
    seen: set[int] = set()
    for offset, matched in _rule_hits(rule, view):
        line = view.line(offset)
        if line not in seen:
            seen.add(line)
            snippet = " ".join(matched.split())[:60]
            yield Violation(rule.name, line, f"{snippet!r}: {rule.rationale}")


def _bracket_pairs(code: str) -> dict[int, int]:
    """Offset of every (, [ and { in `code` -> offset of the bracket closing it (unclosed ones are absent)."""
    pairs, stack = {}, []
    closing = {")": "(", "]": "[", "}": "{"}
    for m in re.finditer(r"[()\[\]{}]", code):
        ch = m.group()
        if ch in "([{":
            stack.append((ch, m.start()))
        elif stack and stack[-1][0] == closing[ch]:
            pairs[stack.pop()[1]] = m.start()
    return pairs


def _top_level_params(params: str) -> int:
    if not params.strip() or params.strip() == "void":
        return 0
    depth, count = 0, 1
    for ch in params:
        depth += ch in "([{"
        depth -= ch in ")]}"
        count += ch == "," and depth == 0
    return count


_EXTERN_C = re.compile(r'\bextern\s*"C"')
_EXTERN_C_BLOCK = re.compile(r'\bextern\s*"C"\s*\{')
_AFTER_PARAMS = re.compile(
    r"\s*(?:(?:noexcept|throw\s*\(\s*\)|__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\))\s*)*([{;])"
)
_ENTRY_CALL = re.compile(rf"\b{ENTRY_POINT}\s*\(")
_MAX_DECLS = 64  # declarations of the entry point (and extern "C" blocks) examined; real sources have one or two
_MAX_PREFIX = 4096  # how far before the name its declaration's extern "C" may be


def _entry_point_declarations(code: str) -> Iterator[tuple[bool, bool]]:
    """(is a definition, has C linkage) for the 9-parameter declarations of the entry point."""
    pairs = _bracket_pairs(code)
    blocks = [(m.end() - 1, pairs.get(m.end() - 1, len(code))) for m in _EXTERN_C_BLOCK.finditer(code)][:_MAX_DECLS]
    for m in list(_ENTRY_CALL.finditer(code))[:_MAX_DECLS]:
        close = pairs.get(m.end() - 1, -1)
        if close < 0 or _top_level_params(code[m.end() : close]) != ENTRY_POINT_PARAMS:
            continue
        after = _AFTER_PARAMS.match(code, close + 1)
        floor = max(0, m.start() - _MAX_PREFIX)
        boundary = max(floor, *(code.rfind(c, floor, m.start()) + 1 for c in ";{}"))
        in_block = any(b0 < m.start() < b1 for b0, b1 in blocks)
        linkage = in_block or _EXTERN_C.search(code, boundary, m.start()) is not None
        yield after is not None and after.group(1) == "{", linkage


def _entry_point_violations(view: _View) -> list[Violation]:
    decls = list(_entry_point_declarations(view.code))
    if any(d for d, _ in decls) and any(c for _, c in decls):
        return []
    return [
        Violation(
            "missing_entry_point",
            0,
            f'no extern "C" definition of {ENTRY_POINT} with {ENTRY_POINT_PARAMS} parameters; the harness calls'
            f" exactly {ENTRY_SIGNATURE}",
        )
    ]


def check_source(source: str) -> list[Violation]:
    """Every source rule the candidate breaks, sorted by line (line 0 for whole-file rules)."""
    size = len(source.encode("utf-8", errors="surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        return [Violation("oversized_source", 0, f"the source is {size} bytes; the limit is {MAX_SOURCE_BYTES} bytes")]
    view = _view(source)
    found = _entry_point_violations(view)
    for rule in SOURCE_RULES:
        found.extend(_rule_violations(rule, view))
    return sorted(found, key=lambda v: (v.line, v.rule))


_CUTLASS_INCLUDE = re.compile(_include(r"(?:cute|cutlass)/[\w./]+"))


def includes_cutlass(source: str) -> bool:
    """True when the source #includes a CUTLASS or CuTe header outside comments. Such a source needs the pinned
    nvidia-cutlass headers: on a machine without them its compile error is the machine's, not the candidate's."""
    return _CUTLASS_INCLUDE.search(_view(source).code) is not None


def spells_programmatic_launch(source: str) -> bool:
    """True when the source names programmatic dependent launch (PDL_RULES) anywhere outside comments."""
    view = _view(source)
    return any(next(_rule_hits(rule, view), None) is not None for rule in PDL_RULES)

# --------------------------------------------------------------------------------------------------------------
# Library rules
# --------------------------------------------------------------------------------------------------------------

# Names in mangled C++ standard-library symbols that reach files, threads, clocks, randomness or the environment.
# Named locales read locale files and $LANG; the default std::locale (which std::ostringstream uses) reads nothing.
_STD_DENIED = (
    r"(?!\w*(?:fstream|filebuf|basic_file|thread|chrono|_clock|random_device|filesystem|getenv|future|async|futex"
    r"|condition_variable|semaphore|6localeC[12]E(?:PKc|RKNSt7__cxx1112basic_string|RKS_PKc|RKS_RKNSt7__cxx11)"
    r"|6locale6global))"
)

# Undefined dynamic symbols a candidate library may import, as (regex matched against the whole name, rationale).
SYMBOL_ALLOWLIST: tuple[tuple[str, str], ...] = (
    (
        r"__cudaRegister\w*|__cudaUnregisterFatBinary|__cudaPushCallConfiguration|__cudaPopCallConfiguration"
        r"|__cudaInitModule|__cudaLaunchKernel(?:_ptsz)?|__cudaGetKernel",
        "registration and launch glue nvcc emits for every kernel",
    ),
    (
        r"cudaLaunchKernel(?:ExC)?(?:_ptsz)?|cudaLaunchCooperativeKernel(?:_ptsz)?",
        "kernel launches, on the stream the caller passes",
    ),
    (
        r"cudaFuncSetAttribute|cudaFuncGetAttributes|cudaFuncSetCacheConfig|cudaGetFuncBySymbol",
        "per-kernel configuration (dynamic shared memory, carve-out)",
    ),
    (r"cudaGetLastError|cudaPeekAtLastError|cudaGetErrorString|cudaGetErrorName", "error reporting"),
    (
        r"cudaGetDevice|cudaGetDeviceCount|cudaDeviceGetAttribute|cudaGetDeviceProperties\w*|cudaDriverGetVersion"
        r"|cudaRuntimeGetVersion|cudaOccupancy\w*",
        "read-only device and occupancy queries",
    ),
    (
        r"cuda(?:Memset|Memset2D)Async(?:_ptsz)?|cudaGetSymbolAddress",
        "stream-ordered fills on the caller's stream (copies are not allowed: they can touch host memory)",
    ),
    (
        r"cuTensorMapEncodeTiled|cuTensorMapEncodeIm2col|cuGetErrorString|cuGetErrorName",
        "pure host-side TMA descriptor builders (CUTLASS needs them)",
    ),
    (
        r"mem(?:cpy|move|set|cmp|chr)|str(?:n?len|n?cmp|n?cpy|r?chr|str)|__(?:mem(?:cpy|move|set)|strn?cpy)_chk",
        "memory and string helpers",
    ),
    (
        r"v?printf|v?fprintf|puts|putchar|fputs|fputc|fwrite|fflush|v?snprintf|v?sprintf"
        r"|__(?:v?f?printf|v?s?n?printf)_chk|stdout|stderr",
        "printing (no FILE* other than stdout/stderr can be obtained: fopen and friends are denied)",
    ),
    (r"malloc|calloc|realloc|free|aligned_alloc|posix_memalign|_Zn[wa]\w*|_Zd[la]\w*", "host heap memory"),
    (
        r"__cxa_\w+|_Unwind_Resume|__gxx_personality_v0|__stack_chk_fail|__assert_fail|__tls_get_addr|__gmon_start__"
        r"|_ITM_\w+|__libc_single_threaded",
        "C++ runtime support (exceptions, static initialisation, stack protector, shared_ptr reference counts)",
    ),
    (
        r"(?:sqrt|cbrt|exp|exp2|expm1|log|log2|log10|log1p|pow|floor|ceil|fabs|fmin|fmax|fmod|ldexp|frexp|round"
        r"|lround|llround|trunc|rint|lrint|nearbyint|modf|hypot|sin|cos|tan|tanh|atan|atan2|erf)[fl]?|__\w+_finite",
        "math",
    ),
    (
        r"__u?(?:div|mod)ti3",
        "128-bit integer division from the compiler runtime (libgcc); pure arithmetic, e.g. CUTLASS's host-side"
        " FastDivmodU64 in every sm90 GEMM's argument setup",
    ),
    (r"abs|labs|llabs|qsort|bsearch|strto(?:l|ul|ll|ull|f|d)|atoi|atol|atoll|atof", "plain libc helpers"),
    (
        rf"(?:_ZNSt|_ZSt|_ZNKSt|_ZTV|_ZTT|_ZTI|_ZTS|_ZNSo|_ZNKSo){_STD_DENIED}\w*",
        "C++ standard library (minus files, threads, clocks, randomness, locales)",
    ),
)

_ALLOWED = re.compile("|".join(f"(?:{rx})" for rx, _ in SYMBOL_ALLOWLIST))

# Defined dynamic symbols that could shadow the harness's functions (checked against the whole name).
INTERPOSABLE = re.compile(
    r"cuda(?!l2_)\w+|cu[A-Z]\w*|__cuda(?!RegisterLinkedBinary_)\w*|cublas\w*|pthread_\w+|dl\w*open|dl[v]?sym"
    r"|clock_gettime|gettimeofday|malloc|calloc|realloc|free"
)
# nvcc -rdc=true exports __cudaRegisterLinkedBinary_<hash> itself; that one is not the candidate's doing.

_NM_LINE = re.compile(r"^\s*(?:[0-9a-fA-F]+\s+)?(?P<type>[A-Za-z?])\s+(?P<name>\S+)\s*$")
_FUNCTION_HEADER = re.compile(r"^[0-9a-fA-F]+ <(?P<name>.+)>:\s*$")
_INSTRUCTION = re.compile(
    r"^\s*[0-9a-fA-F]+:\s+(?:(?:lock|rep\w*|notrack|bnd|data16|addr32|[cdefgs]s)\s+)*"
    r"(?P<mnemonic>syscall|sysenter|rdtscp|rdtsc|rdpid|int\s+\$0x80)\b"
)


class _LinkCheckError(Exception):
    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.violation = Violation(rule, 0, message)


def _run_tool(argv: list[str]) -> str:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TOOL_TIMEOUT_S,
            env={**os.environ, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        raise _LinkCheckError("unreadable_library", f"{argv[0]} took over {TOOL_TIMEOUT_S} s") from None
    except OSError as e:
        raise _LinkCheckError("link_check_unavailable", f"cannot run {argv[0]}: {e}") from None
    if proc.returncode != 0:
        raise _LinkCheckError("unreadable_library", f"{os.path.basename(argv[0])} failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def _dynamic_symbols(nm: str, lib_path: str, which: str) -> dict[str, str]:
    """name (version suffix stripped) -> nm type letter, for `which` in --undefined-only/--defined-only."""
    symbols = {}
    for line in _run_tool([nm, "-D", which, lib_path]).splitlines():
        m = _NM_LINE.match(line)
        if m:
            symbols[m.group("name").split("@", 1)[0]] = m.group("type")
    return symbols


def _denial_hint(name: str) -> str:
    for rule in SOURCE_RULES:
        if rule.scope == "code" and rule.name != "interposition" and rule.pattern.search(f" {name}("):
            return f" ({rule.name}: {rule.rationale})"
    if name.startswith("_Z"):
        return " (C++ standard-library facilities for files, threads, clocks, randomness and locales are denied)"
    return ""


def _forbidden_symbols(undefined: Iterable[str]) -> Iterator[Violation]:
    for name in sorted(undefined):
        if not _ALLOWED.fullmatch(name):
            yield Violation(
                "forbidden_symbol", 0, f"imports {name!r}, which is not on the allowlist{_denial_hint(name)}"
            )


def _interposed_symbols(defined: Iterable[str]) -> Iterator[Violation]:
    for name in sorted(defined):
        if INTERPOSABLE.fullmatch(name):
            yield Violation(
                "interposition",
                0,
                f"exports {name!r}, which could shadow the CUDA, libc or timer function of that name in the harness",
            )


def _host_instructions(disassembly: str) -> Iterator[Violation]:
    function, seen = "?", set()
    for line in disassembly.splitlines():
        header = _FUNCTION_HEADER.match(line)
        if header:
            function = header.group("name")
            continue
        m = _INSTRUCTION.match(line)
        if m:
            mnemonic = " ".join(m.group("mnemonic").split())
            if (function, mnemonic) not in seen:
                seen.add((function, mnemonic))
                yield Violation(
                    "host_instruction",
                    0,
                    f"host function {function} executes {mnemonic!r}, which"
                    " reaches the kernel or a timer directly; a GEMM needs neither",
                )


def check_library(lib_path: str) -> list[Violation]:
    """Symbol and instruction rules on the nvcc-built shared library; never raises on a bad file."""
    nm, objdump = shutil.which("nm"), shutil.which("objdump")
    if nm is None or objdump is None:
        return [Violation("link_check_unavailable", 0, "nm and objdump (binutils) are needed for the link check")]
    if not os.path.isfile(lib_path):
        return [Violation("unreadable_library", 0, f"{lib_path} is not a file")]
    try:
        undefined = _dynamic_symbols(nm, lib_path, "--undefined-only")
        defined = _dynamic_symbols(nm, lib_path, "--defined-only")
        disassembly = _run_tool([objdump, "-d", "--no-show-raw-insn", "-C", lib_path])
    except _LinkCheckError as e:
        return [e.violation]
    found = [*_forbidden_symbols(undefined), *_interposed_symbols(defined), *_host_instructions(disassembly)]
    if defined.get(ENTRY_POINT) not in ("T", "t", "W", "i"):
        found.append(Violation("missing_entry_point", 0, f"the library exports no function {ENTRY_POINT}"))
    return found
