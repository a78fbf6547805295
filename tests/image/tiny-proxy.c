/* A stand-in for the Nexo Proxy in the node tests: accepts TCP connections
 * on port 27017 (or the first argument) and closes them; exits 0 on
 * SIGTERM. Built statically with musl-gcc by tests/image/build-image.sh. */
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 27017;
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 16) < 0) {
    perror("tiny-proxy: listen");
    return 1;
  }
  fprintf(stderr, "tiny-proxy: listening on %d\n", port);
  for (;;) {
    int c = accept(fd, NULL, NULL);
    if (c >= 0) close(c);
  }
}
