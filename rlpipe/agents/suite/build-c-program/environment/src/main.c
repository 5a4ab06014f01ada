#include "greet.h"

int main(void) {
    greet("rlpipe");
    return 0;
}
