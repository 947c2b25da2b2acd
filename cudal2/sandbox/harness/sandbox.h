// sandbox.h: confinement a harness process applies to itself before it loads a candidate library.
//
// Shared by the CUDA harness (harness.cu) and the CPU test double (tests use fake_harness.c), so the CPU test
// suite exercises the same code that guards the GPU runs. Plain C, Linux only.
//
// Layers, each reported (on/off and why) so the parent can state which ones the machine permitted:
//   netns    : unshare(CLONE_NEWNET): the process gets an empty network namespace (needs root or userns).
//   landlock : file writes only beneath the candidate's temp dir (and the GPU device nodes), no TCP bind or
//              connect, no signals to and no ptrace of processes outside the sandbox (kernel ABI >= 6 for
//              signals; earlier ABIs still block ptrace of outsiders).
//   seccomp  : fork/vfork/non-thread clone, exec, ptrace, sockets, process_vm_*, namespace and mount calls
//              fail with EPERM (clone3 with ENOSYS so libc falls back to the inspectable clone).
// Resource limits (core dumps, file size, open files) are set by the parent before exec (runner.py).
#ifndef CUDAL2_SANDBOX_H
#define CUDAL2_SANDBOX_H

#define _GNU_SOURCE 1
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/audit.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char netns[160];
  char landlock[160];
  char seccomp[160];
} cudal2_sandbox_report;

// ---- landlock (own definitions: the build machine's headers may predate the ABI we use) ----
#define CL2_LL_CREATE_RULESET 444
#define CL2_LL_ADD_RULE 445
#define CL2_LL_RESTRICT_SELF 446
#define CL2_LL_VERSION_FLAG 1u
#define CL2_LL_RULE_PATH_BENEATH 1

struct cl2_ll_ruleset_attr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};
struct cl2_ll_path_beneath_attr {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

#define CL2_FS_WRITE_FILE (1ull << 1)
#define CL2_FS_REMOVE_DIR (1ull << 4)
#define CL2_FS_REMOVE_FILE (1ull << 5)
#define CL2_FS_MAKE_CHAR (1ull << 6)
#define CL2_FS_MAKE_DIR (1ull << 7)
#define CL2_FS_MAKE_REG (1ull << 8)
#define CL2_FS_MAKE_SOCK (1ull << 9)
#define CL2_FS_MAKE_FIFO (1ull << 10)
#define CL2_FS_MAKE_BLOCK (1ull << 11)
#define CL2_FS_MAKE_SYM (1ull << 12)
#define CL2_FS_REFER (1ull << 13)
#define CL2_FS_TRUNCATE (1ull << 14)
#define CL2_NET_BIND_TCP (1ull << 0)
#define CL2_NET_CONNECT_TCP (1ull << 1)
#define CL2_SCOPE_ABSTRACT_UNIX (1ull << 0)
#define CL2_SCOPE_SIGNAL (1ull << 1)

static int cl2_ll_allow(int ruleset, const char* path, uint64_t access) {
  struct cl2_ll_path_beneath_attr attr;
  int fd = open(path, O_PATH | O_CLOEXEC);
  if (fd < 0) return -1;
  attr.allowed_access = access;
  attr.parent_fd = fd;
  int rc = (int)syscall(CL2_LL_ADD_RULE, ruleset, CL2_LL_RULE_PATH_BENEATH, &attr, 0);
  close(fd);
  return rc;
}

// Write access for the GPU's device nodes: the driver opens them read-write, also after we restrict.
static void cl2_ll_allow_devices(int ruleset, uint64_t file_write) {
  cl2_ll_allow(ruleset, "/dev/null", file_write);
  DIR* d = opendir("/dev");
  if (!d) return;
  struct dirent* e;
  char path[300];
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "nvidia", 6) != 0) continue;
    snprintf(path, sizeof path, "/dev/%s", e->d_name);
    if (e->d_type == DT_DIR) continue;  // e.g. /dev/nvidia-caps: left read-only
    cl2_ll_allow(ruleset, path, file_write);
  }
  closedir(d);
}

static void cl2_landlock(const char* writable_dir, char* out, size_t n) {
  long abi = syscall(CL2_LL_CREATE_RULESET, NULL, 0, CL2_LL_VERSION_FLAG);
  if (abi < 1) {
    snprintf(out, n, "off: landlock unavailable (errno %d)", errno);
    return;
  }
  struct cl2_ll_ruleset_attr attr;
  memset(&attr, 0, sizeof attr);
  uint64_t dir_write = CL2_FS_WRITE_FILE | CL2_FS_REMOVE_DIR | CL2_FS_REMOVE_FILE | CL2_FS_MAKE_CHAR |
                       CL2_FS_MAKE_DIR | CL2_FS_MAKE_REG | CL2_FS_MAKE_SOCK | CL2_FS_MAKE_FIFO |
                       CL2_FS_MAKE_BLOCK | CL2_FS_MAKE_SYM;
  uint64_t file_write = CL2_FS_WRITE_FILE;
  if (abi >= 2) dir_write |= CL2_FS_REFER;
  if (abi >= 3) {
    dir_write |= CL2_FS_TRUNCATE;
    file_write |= CL2_FS_TRUNCATE;
  }
  attr.handled_access_fs = dir_write;
  size_t size = offsetof(struct cl2_ll_ruleset_attr, handled_access_net);
  if (abi >= 4) {
    attr.handled_access_net = CL2_NET_BIND_TCP | CL2_NET_CONNECT_TCP;  // no rule added: no TCP at all
    size = offsetof(struct cl2_ll_ruleset_attr, scoped);
  }
  if (abi >= 6) {
    attr.scoped = CL2_SCOPE_ABSTRACT_UNIX | CL2_SCOPE_SIGNAL;
    size = sizeof attr;
  }
  int rs = (int)syscall(CL2_LL_CREATE_RULESET, &attr, size, 0);
  if (rs < 0) {
    snprintf(out, n, "off: landlock_create_ruleset failed (errno %d)", errno);
    return;
  }
  if (cl2_ll_allow(rs, writable_dir, dir_write) != 0) {
    snprintf(out, n, "off: cannot add a rule for the temp dir (errno %d)", errno);
    close(rs);
    return;
  }
  cl2_ll_allow_devices(rs, file_write);
  if (syscall(CL2_LL_RESTRICT_SELF, rs, 0) != 0) {
    snprintf(out, n, "off: landlock_restrict_self failed (errno %d)", errno);
  } else {
    snprintf(out, n, "on: abi %ld, writes only beneath the temp dir%s%s", abi, abi >= 4 ? ", no tcp" : "",
             abi >= 6 ? ", signals scoped" : "");
  }
  close(rs);
}

// ---- seccomp ----
#define CL2_DENY(nr, err)                                        \
  BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),               \
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((err) & SECCOMP_RET_DATA))

static void cl2_seccomp(char* out, size_t n) {
#if defined(__x86_64__)
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      // clone: threads (CLONE_THREAD, 0x10000) are allowed, new processes are not.
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0, 4),  // not clone: skip the 4 clone statements
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x10000, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      CL2_DENY(__NR_clone3, ENOSYS),
      CL2_DENY(__NR_fork, EPERM),
      CL2_DENY(__NR_vfork, EPERM),
      CL2_DENY(__NR_execve, EPERM),
      CL2_DENY(__NR_execveat, EPERM),
      CL2_DENY(__NR_ptrace, EPERM),
      CL2_DENY(__NR_kill, EPERM),
      CL2_DENY(__NR_socket, EPERM),
      CL2_DENY(__NR_socketpair, EPERM),
      CL2_DENY(__NR_process_vm_readv, EPERM),
      CL2_DENY(__NR_process_vm_writev, EPERM),
      CL2_DENY(__NR_unshare, EPERM),
      CL2_DENY(__NR_setns, EPERM),
      CL2_DENY(__NR_mount, EPERM),
      CL2_DENY(__NR_bpf, EPERM),
      CL2_DENY(__NR_perf_event_open, EPERM),
      CL2_DENY(__NR_keyctl, EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof filter[0]), filter};
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    snprintf(out, n, "off: seccomp filter refused (errno %d)", errno);
  } else {
    snprintf(out, n, "on: no fork/exec/ptrace/sockets/kill");
  }
#else
  snprintf(out, n, "off: seccomp filter written for x86_64 only");
#endif
}

// Network namespace first (before any socket exists), then landlock and seccomp. Call after the GPU and the
// libraries the harness itself needs are initialised, and before the candidate library is loaded.
static void cudal2_sandbox_netns(cudal2_sandbox_report* r) {
  if (unshare(CLONE_NEWNET) == 0) {
    snprintf(r->netns, sizeof r->netns, "on: empty network namespace");
  } else {
    snprintf(r->netns, sizeof r->netns, "off: unshare(CLONE_NEWNET) not permitted (errno %d)", errno);
  }
}

static void cudal2_sandbox_confine(const char* writable_dir, cudal2_sandbox_report* r) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    snprintf(r->landlock, sizeof r->landlock, "off: no_new_privs refused (errno %d)", errno);
    snprintf(r->seccomp, sizeof r->seccomp, "off: no_new_privs refused (errno %d)", errno);
    return;
  }
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  // no core dumps, no ptrace attach by same-uid processes
  cl2_landlock(writable_dir, r->landlock, sizeof r->landlock);
  cl2_seccomp(r->seccomp, sizeof r->seccomp);
}

#ifdef __cplusplus
}
#endif
#endif  // CUDAL2_SANDBOX_H
