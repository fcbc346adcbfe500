// The plot widgets' textures (ui/plot/texture.h) in the console's OpenGL context: ImGui's OpenGL 3 backend
// binds an ImTextureID as the GLuint it holds.
#include <GL/gl.h>

#include <cstdint>

#include "app/console_parts.h"

namespace gantry {

ImTextureID ConsoleTextures::create(int w, int h) {
  GLuint tex = 0;
  glGenTextures(1, &tex);
  glBindTexture(GL_TEXTURE_2D, tex);
  // Nearest: a cell is a block of one colour, never blended into its neighbours.
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
  glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, w, h, 0, GL_RGBA, GL_UNSIGNED_BYTE, nullptr);
  return reinterpret_cast<ImTextureID>(static_cast<intptr_t>(tex));
}

void ConsoleTextures::update(ImTextureID id, const uint32_t* rgba, int w, int h) {
  glBindTexture(GL_TEXTURE_2D, static_cast<GLuint>(reinterpret_cast<intptr_t>(id)));
  glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
  // IM_COL32 keeps R in the low byte: on a little-endian machine the bytes are R, G, B, A.
  glTexSubImage2D(GL_TEXTURE_2D, 0, 0, 0, w, h, GL_RGBA, GL_UNSIGNED_BYTE, rgba);
}

void ConsoleTextures::destroy(ImTextureID id) {
  const GLuint tex = static_cast<GLuint>(reinterpret_cast<intptr_t>(id));
  glDeleteTextures(1, &tex);
}

}  // namespace gantry
