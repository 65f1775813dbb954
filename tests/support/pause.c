/* SPDX-License-Identifier: Apache-2.0 */
/* The sandbox ("pause") container of the CRI tests (tests/support/images.py builds it
 * statically into a one-file image): it holds the pod's namespaces, reaps whatever is
 * re-parented to it, and exits on SIGTERM or SIGINT, as the Kubernetes pause image does. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void reap(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

int main(void)
{
    struct sigaction quit = {.sa_handler = stop}, child = {.sa_handler = reap};
    sigaction(SIGTERM, &quit, NULL);
    sigaction(SIGINT, &quit, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;)
        pause();
}
