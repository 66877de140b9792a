/*
 * probe: make one raw system call inside a sandbox and report what the
 * kernel answered, in the spirit of bubblewrap's tests/try-syscall.c.
 * Arguments default to 1, an invalid pointer and an invalid flag word, so
 * that a call the filter lets through fails harmlessly (EFAULT, EBADF,
 * EINVAL, ...) and can be told apart from the filter's own errno.
 *
 *   probe nr N [ARG...]   syscall(N, ARG...)              native ABI
 *   probe int80 N [ARG...] i386 syscall N via int $0x80   (x86_64 only)
 *   probe x32 N [ARG...]  syscall(N | 0x40000000, ...)    (x86_64 only)
 *
 * Output: "ok RET" or "errno N". A seccomp kill shows up as death by
 * SIGSYS (exit status 159 in sh). Built static (gcc -static) and
 * single-threaded, so a thread kill is a process kill.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

int main(int argc, char **argv)
{
	long a[6] = {1, 1, 1, 1, 1, 1};
	long nr, ret;
	int i;

	if (argc < 3) {
		fprintf(stderr, "usage: probe nr|int80|x32 N [ARG...]\n");
		return 2;
	}
	nr = (long)strtoull(argv[2], NULL, 0);
	for (i = 3; i < argc && i < 9; i++)
		a[i - 3] = (long)strtoull(argv[i], NULL, 0);

	if (strcmp(argv[1], "nr") == 0) {
		ret = syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
	} else if (strcmp(argv[1], "x32") == 0) {
		ret = syscall(nr | 0x40000000L, a[0], a[1], a[2], a[3], a[4], a[5]);
	} else if (strcmp(argv[1], "int80") == 0) {
#if defined(__x86_64__)
		__asm__ volatile("int $0x80"
				 : "=a"(ret)
				 : "a"(nr), "b"(a[0]), "c"(a[1]), "d"(a[2]), "S"(a[3]), "D"(a[4])
				 : "memory");
		if (ret < 0 && ret > -4096) {
			errno = (int)-ret;
			ret = -1;
		}
#else
		fprintf(stderr, "int80 is x86_64 only\n");
		return 3;
#endif
	} else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	if (ret == -1)
		printf("errno %d\n", errno);
	else
		printf("ok %ld\n", ret);
	fflush(stdout);
	return 0;
}
