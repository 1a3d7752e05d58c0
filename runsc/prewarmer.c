/*
 * gvisor-sentry-prewarmer, readie's own (`make runsc` installs it in gvisor-bin/ beside runsc).
 *
 * The contract, read in the pinned gVisor (runsc/sandbox/sandbox.go, createSandboxProcess):
 * when gvisor-bin/ holds an executable file of this name, runsc starts the sandbox process as
 *
 *     gvisor-sentry-prewarmer SENTRY ARGV0 [ARG...]
 *
 * with the sentry's descriptors and environment, instead of SENTRY itself, and expects SENTRY
 * to run with the argument vector ARGV0 ARG... and that environment, unchanged.
 *
 * What it does before that: it makes the kernel's descriptor table of the process large
 * enough for the highest descriptor the sentry will use. The table survives execve, and grows
 * only when a descriptor beyond it is first used; the sentry moves its stdio up to
 * startingStdioFD = 253 .. 255 (runsc/boot/loader.go), and a Go program is multi-threaded
 * from its start, where growing the table waits for an RCU grace period. Here, single-threaded
 * before the execve, it does not.
 *
 * Freestanding (no libc, no start files): nothing runs before prewarm_main but _start below,
 * nothing is allocated, and the static binary needs no loader. Failures: a usage error exits 2,
 * an execve that fails exits 127, each with a line on stderr; a table that cannot be grown is
 * only said on stderr, since the sentry grows it itself then, more slowly.
 */
#include <asm/unistd.h>  /* __NR_* of the target architecture */
#include <linux/errno.h> /* EBADF */
#include <linux/fcntl.h> /* F_DUPFD_CLOEXEC, O_PATH, O_CLOEXEC, AT_FDCWD */

/* The sentry's stdio descriptors start here (runsc/boot/loader.go of the pin); stderr is the
 * third. A test compares it with the pinned gVisor's source. */
#define SENTRY_FIRST_STDIO_FD 253
#define SENTRY_HIGHEST_FD (SENTRY_FIRST_STDIO_FD + 2)

#define EXIT_USAGE 2
#define EXIT_EXEC_FAILED 127

#if defined(__x86_64__)
static long call3(long nr, long a, long b, long c) {
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c)
			 : "rcx", "r11", "memory");
	return ret;
}
#elif defined(__aarch64__)
static long call3(long nr, long a, long b, long c) {
	register long x8 __asm__("x8") = nr;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	__asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory", "cc");
	return x0;
}
#else
#error "gvisor-sentry-prewarmer: only x86_64 and aarch64 (the platforms runsc runs on)"
#endif

static void say(const char *s) {
	long n = 0;
	while (s[n] != '\0')
		n++;
	call3(__NR_write, 2, (long)s, n);
}

/* say_errno says " (errno N)\n" for a raw syscall's negative result. */
static void say_errno(long result) {
	char digits[24];
	int i = sizeof(digits);
	unsigned long n = (unsigned long)-result;
	digits[--i] = '\0';
	digits[--i] = '\n';
	digits[--i] = ')';
	do {
		digits[--i] = (char)('0' + n % 10);
		n /= 10;
	} while (n > 0 && i > 0);
	say(" (errno ");
	say(&digits[i]);
}

static __attribute__((noreturn)) void leave(long code) {
	for (;;)
		call3(__NR_exit_group, code, 0, 0);
}

/* grow_fd_table makes descriptor SENTRY_HIGHEST_FD fit in the table without taking it:
 * F_DUPFD_CLOEXEC takes the lowest free descriptor at or above it, never an inherited one, and
 * the copy is closed at once. The source is any descriptor already open, or one of "/". */
static void grow_fd_table(void) {
	long copy = -EBADF;
	for (long fd = 0; fd <= 2 && copy == -EBADF; fd++)
		copy = call3(__NR_fcntl, fd, F_DUPFD_CLOEXEC, SENTRY_HIGHEST_FD);
	if (copy == -EBADF) {
		long root = call3(__NR_openat, AT_FDCWD, (long)"/", O_PATH | O_CLOEXEC);
		copy = root;
		if (root >= 0) {
			copy = call3(__NR_fcntl, root, F_DUPFD_CLOEXEC, SENTRY_HIGHEST_FD);
			call3(__NR_close, root, 0, 0);
		}
	}
	if (copy < 0) {
		say("gvisor-sentry-prewarmer: the descriptor table was not grown, the sentry grows it (slower)");
		say_errno(copy);
		return;
	}
	call3(__NR_close, copy, 0, 0);
}

/* prewarm_main gets the initial stack: argc, then argv's pointers and a null, then envp's. */
__attribute__((noreturn, used)) void prewarm_main(long *stack) {
	long argc = stack[0];
	char **argv = (char **)&stack[1];
	char **envp = &argv[argc + 1];
	if (argc < 3) {
		say("usage: gvisor-sentry-prewarmer SENTRY ARGV0 [ARG...] (runsc runs it, in place of the sentry)\n");
		leave(EXIT_USAGE);
	}
	grow_fd_table();
	/* argv[2..] ends with argv's own null: the sentry's argument vector as it is. */
	long err = call3(__NR_execve, (long)argv[1], (long)&argv[2], (long)envp);
	say("gvisor-sentry-prewarmer: execve ");
	say(argv[1]);
	say_errno(err);
	leave(EXIT_EXEC_FAILED);
}

/* The entry point: the kernel leaves the initial stack at the stack pointer, 16-byte aligned. */
#if defined(__x86_64__)
__asm__(".text\n"
	".global _start\n"
	"_start:\n"
	"	xor %ebp, %ebp\n"
	"	mov %rsp, %rdi\n"
	"	call prewarm_main\n"
	"	hlt\n");
#elif defined(__aarch64__)
__asm__(".text\n"
	".global _start\n"
	"_start:\n"
	"	mov x29, #0\n"
	"	mov x0, sp\n"
	"	bl prewarm_main\n"
	"	brk #0\n");
#endif
