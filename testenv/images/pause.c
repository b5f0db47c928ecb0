/* The pod sandbox's process (containerd's sandbox_image): holds the pod's namespaces
 * until it is told to stop. SIGINT/SIGTERM: exit 0. SIGCHLD: reap (it is PID 1 when the
 * pod shares its PID namespace). Built with gcc -static -Os by testenv/images/build.sh. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) {
    (void)signo;
    _exit(0);
}

static void reap(int signo) {
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("pause (nodeledger testenv)");
        return 0;
    }
    if (getpid() != 1) {
        fputs("pause: warning: not PID 1\n", stderr);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = stop;
    if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) {
        return 1;
    }
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) < 0) {
        return 2;
    }
    for (;;) {
        pause();
    }
}
